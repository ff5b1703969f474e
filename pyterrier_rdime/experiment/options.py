"""The run's protocol options (:class:`Options`), checked when built."""
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from .._config import check_bool, check_choice, check_fraction, check_int, reject
from . import parity
from .indexes import RETRIEVERS, require_faiss
from .systems import CONTROLS, DEFAULT_CONTROLS, DIME_NAMES, FEEDBACKS, MODULATORS

STAGE = 'rdime-experiment'


@dataclass(frozen=True)
class Options:
    """The run's protocol options, checked when built: each error names the option (as the command spells it) and
    the fix. The command builds them from its parser; the grid's cell key and the recorded settings derive from the
    fields (:data:`OPTION_NAMES`). Lists become tuples without repeats, fractions floats."""
    mode: str = 'rerank'
    first_stage: str = 'auto'
    feedback: str = 'dense'
    depth: int = 100
    num_results: int = 1000
    dimes: Tuple[str, ...] = ('prf', 'swc', 'llm')
    ks: Tuple[float, ...] = (0.4, 0.6, 0.8)
    modulators: Tuple[str, ...] = ()
    masses: Tuple[float, ...] = ()
    controls: Tuple[str, ...] = DEFAULT_CONTROLS
    control_seeds: int = 10
    test: str = 't'
    alternative: str = 'two-sided'
    margin: float = parity.DEFAULT_MARGIN
    sweep: bool = True
    folds: int = parity.CV_FOLDS
    retriever: str = 'numpy'
    shards: int = 1
    max_queries: Optional[int] = None

    def __post_init__(self):
        object.__setattr__(self, 'first_stage', str(self.first_stage))
        object.__setattr__(self, 'ks', tuple(self.ks))
        for name in ('dimes', 'modulators', 'masses', 'controls'):
            object.__setattr__(self, name, tuple(dict.fromkeys(getattr(self, name))))
        if not self.dimes:
            raise ValueError(f'{STAGE}: --dimes is empty; choose among {", ".join(DIME_NAMES)}')
        for option, values, choices in (('--mode', [self.mode], ('rerank', 'retrieve')),
                                        ('--feedback', [self.feedback], FEEDBACKS),
                                        ('--retriever', [self.retriever], tuple(RETRIEVERS)),
                                        ('--test', [self.test], parity.TESTS),
                                        ('--alternative', [self.alternative], parity.ALTERNATIVES),
                                        ('--dimes', self.dimes, DIME_NAMES),
                                        ('--modulators', self.modulators, tuple(MODULATORS)),
                                        ('--controls', self.controls, CONTROLS)):
            for value in values:
                check_choice(STAGE, option, value, choices)
        for mass in self.masses:
            check_fraction(STAGE, '--score-mass', mass, hint='shares of the positive importance mass, e.g. 0.8')
        for k in self.ks:
            check_fraction(STAGE, '--ks', k, hint='Top-k values are fractions of the dimensions, e.g. 0.4,0.6,0.8')
        for option, value in (('--control-seeds', self.control_seeds), ('--depth', self.depth),
                              ('--num-results', self.num_results), ('--shards', self.shards),
                              ('--max-queries', 1 if self.max_queries is None else self.max_queries)):
            check_int(STAGE, option, value, 1)
        check_int(STAGE, '--folds', self.folds, 2, 'cross-validation needs at least 2 folds of queries')
        check_bool(STAGE, '--sweep', self.sweep)
        if isinstance(self.margin, bool) or not isinstance(self.margin, (int, float)) or not 0 < self.margin < 1:
            reject(STAGE, '--margin', 'a fraction of the Baseline in (0, 1)', self.margin,
                   f'e.g. {parity.DEFAULT_MARGIN} (±{100 * parity.DEFAULT_MARGIN:g} % of the Baseline)')
        if self.mode == 'retrieve' and self.feedback == 'first-stage':
            raise ValueError(f'{STAGE}: --feedback first-stage applies to --mode rerank; --mode retrieve has no first '
                             'stage (its feedback documents come from the dense ranking): leave --feedback out')
        if self.mode == 'rerank' and self.retriever != 'numpy':
            raise ValueError(f'{STAGE}: --retriever {self.retriever!r} applies to --mode retrieve; re-ranking '
                             're-scores the candidates with the vectors of the index')
        if self.first_stage not in ('auto', 'bm25') and not Path(self.first_stage).is_file():
            raise ValueError(f"{STAGE}: --first-stage {self.first_stage!r} is not 'auto', 'bm25' or an existing TREC "
                             'run file')
        if self.retriever.startswith('faiss-'):
            require_faiss()
        if self.shards != 1 and self.retriever != 'sharded':
            raise ValueError(f'{STAGE}: --shards applies to --retriever sharded; pass both, or leave --shards out')
        for name in ('ks', 'masses'):  # checked as given (a bool is no fraction), kept as floats
            object.__setattr__(self, name, tuple(float(value) for value in getattr(self, name)))

    def check_documents(self, num_docs: Optional[int], source: str) -> None:
        """``--shards`` against the ``num_docs`` of ``source`` (``None``: unknown), checked before any work."""
        if self.retriever == 'sharded' and num_docs is not None and self.shards > num_docs:
            raise ValueError(f'{STAGE}: --shards {self.shards} is more than the {num_docs} documents of {source}, and '
                             f'each shard holds at least one; pass --shards {num_docs} or fewer')

    @property
    def fractions(self) -> List[float]:
        """The Top-k sweep's fractions (none without ``sweep``)."""
        return list(parity.SWEEP) if self.sweep else []

    def settings(self) -> Dict[str, object]:
        """The options as recorded in a result and keyed in a grid cell (lists as lists)."""
        return {name: list(value) if isinstance(value, tuple) else value for name, value in asdict(self).items()}


#: The options' names: the keyword arguments of :func:`run_experiment` that :class:`Options` checks.
OPTION_NAMES = tuple(f.name for f in fields(Options))
