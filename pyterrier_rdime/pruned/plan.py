"""What one call of :class:`PrunedRetriever` will do, and the facts about its queries that the cost model and the
kernels both read: the :class:`Plan` and the :class:`Choice` it comes from (decided once, by :func:`.planner.choose`,
and carried out as it is by the stage and the kernels below it), the kept dimensions of each query, the kept fractions
and the features of a batch. The bottom of the ``pruned`` package: pure numpy, importing none of its siblings."""
import dataclasses
from typing import Tuple

import numpy as np

#: The ways of scoring a call: every dimension with BLAS; the kept dimensions in float32, query after query; the
#: kept dimensions of a whole batch in one pass over the union of their rows; the kept dimensions of the int8 copy,
#: then the documents its error bound cannot rule out re-scored exactly (query after query); the int8 copy for a whole
#: batch in one pass (integer scores from one int8 matrix product per slab of documents), then the same re-scoring.
PATHS = ('dense', 'pruned', 'one pass', 'compressed', 'compressed one pass')
#: Why a path was taken: a forced strategy; the model alone (``'auto'`` without timings, or scoring densely without
#: asking the model); the only candidate; exploring (not yet timed); re-checking the runner-up; the fastest timed.
REASONS = ('forced', 'model', 'only', 'explore', 'recheck', 'measured')


@dataclasses.dataclass(frozen=True)
class Plan:
    """How the queries of one call are scored (one of :data:`PATHS`)."""
    path: str

    def __post_init__(self):
        if self.path not in PATHS:
            raise ValueError(f'unknown path {self.path!r}; expected one of {PATHS}')

    @property
    def strategy(self) -> str:
        """The ``strategy`` value that forces this path's family: ``'pruned'`` for one query at a time or one pass,
        ``'compressed'`` for either compressed path."""
        return {'one pass': 'pruned', 'compressed one pass': 'compressed'}.get(self.path, self.path)


@dataclasses.dataclass(frozen=True)
class Choice:
    """The path of one call as :func:`.planner.choose` took it: its estimated cost (the model's units; NaN where none
    was made), its bucket of like calls (``''`` unless measured) and why it was taken (one of :data:`REASONS`)."""
    path: str
    estimate: float
    bucket: str
    reason: str

    @property
    def plan(self) -> Plan:
        return Plan(self.path)


def kept_dims(query_vecs: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The non-zero entries of each query, concatenated: ``(dims, weights, starts)`` with query ``i``'s kept dims
    (ascending) and values at ``starts[i]:starts[i + 1]``."""
    rows, dims = np.nonzero(query_vecs)
    starts = np.zeros(len(query_vecs) + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=len(query_vecs)), out=starts[1:])
    return dims.astype(np.int64), query_vecs[rows, dims].astype(np.float32), starts


def nonzero_fractions(query_vecs: np.ndarray) -> np.ndarray:
    """The fraction of non-zero dimensions of each query vector (n, dims)."""
    return np.mean(query_vecs != 0, axis=1)


def batch_features(query_vecs: np.ndarray) -> np.ndarray:
    """What a batch's one pass costs in proportion to: ``(queries, union of the kept fractions, sum of the kept
    fractions)``."""
    if not len(query_vecs):
        return np.zeros(3)
    union = float(np.mean((query_vecs != 0).any(axis=0)))
    return np.array([len(query_vecs), union, float(np.sum(nonzero_fractions(query_vecs)))])
