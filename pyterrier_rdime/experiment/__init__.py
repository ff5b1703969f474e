"""The experiment runner (``rdime-experiment``): the paper's grid on a collection, apart from the library stages.

Heavy dependencies (torch, transformers, PISA, ir_datasets, matplotlib) load only when the runner runs.

The modules, by job (no import circle among them: tests/docs/test_house.py checks the whole package):

- inputs and caches: ``fingerprint`` (what a cache was built from, the one ``slug``), ``collection`` (the test
  collections and their files), ``encoders``, ``dense_cache``, ``first_stage``, ``indexes``;
- statistics: ``evaluate`` (measures, ``pt.Experiment``), ``sweep`` (Top-k sweep, cross-validated Top-k),
  ``parity`` (tests, Holm, TOST verdicts);
- outputs: ``figures``, ``report`` (one cell's result, its tables and files), ``tables`` (a grid's combined files);
- orchestration: ``progress`` (a cell's finished systems, recorded to resume after a kill), ``batched`` (systems
  that share their queries searched in one retriever call), ``systems`` (the pipelines of a cell), ``options`` (a
  run's checked protocol options), ``runner`` (one cell), ``cells`` (a grid's cells as Ray tasks on a cluster),
  ``grid`` (cells, resume), ``arguments`` (what the command checks and tells the user), ``cli`` (parse and
  dispatch).
"""
from pyterrier_rdime.experiment.collection import Collection, load_collection
from pyterrier_rdime.experiment.runner import ExperimentResult, run_experiment

__all__ = ['Collection', 'load_collection', 'ExperimentResult', 'run_experiment']
