"""The experiment runner (``rdime-experiment``): the paper's grid on a collection, apart from the library stages.

Heavy dependencies (torch, transformers, PISA, ir_datasets, matplotlib) load only when the runner runs. Modules by
job: inputs and caches (``collection``, ``encoders``, ``indexes``); statistics (``parity``); outputs
(``report``); orchestration (``systems`` with its records, ``runner`` with its ``Options``, ``grid``, ``cli``).
"""
from pyterrier_rdime.experiment.collection import Collection, load_collection
from pyterrier_rdime.experiment.runner import ExperimentResult, run_experiment

__all__ = ['Collection', 'load_collection', 'ExperimentResult', 'run_experiment']
