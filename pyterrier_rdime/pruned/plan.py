"""What one call of :class:`PrunedRetriever` will do (the :class:`Plan` and its :class:`Choice`), and the facts
about its queries that the cost model and the kernels both read. Imports none of its siblings."""
import dataclasses
from typing import Tuple

import numpy as np

#: The ways of scoring a call: BLAS; float32 kept rows per query or in one pass; the int8 copy per query or one pass.
PATHS = ('dense', 'pruned', 'one pass', 'compressed', 'compressed one pass')
#: Why a path was taken: forced, the model alone, the only candidate, exploring, re-checking, the fastest timed.
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
        """The ``strategy`` value that forces this path's family."""
        return {'one pass': 'pruned', 'compressed one pass': 'compressed'}.get(self.path, self.path)


@dataclasses.dataclass(frozen=True)
class Choice:
    """The path of one call as :func:`.planner.choose` took it, its estimated cost, bucket and reason."""
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
    """``(queries, union of the kept fractions, sum of the kept fractions)`` of a batch."""
    if not len(query_vecs):
        return np.zeros(3)
    union = float(np.mean((query_vecs != 0).any(axis=0)))
    return np.array([len(query_vecs), union, float(np.sum(nonzero_fractions(query_vecs)))])
