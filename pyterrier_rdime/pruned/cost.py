"""The cost model behind ``PrunedRetriever(strategy='auto')`` and the one decision of each call: :func:`plan` returns
the :class:`.plan.Plan` the stage and the kernels carry out. The model estimates the time of each scoring path, in
units of one dense ``gemv`` over the whole matrix (one query, every dimension, top-k included), from the fraction of
dimensions each query keeps. Its seven constants are calibrated on the machine in use, not fitted once on another CPU
(:mod:`.calibration`, the harness that times both paths, fits and caches the constants). Pure arithmetic: the model
is handed in by the caller."""
import dataclasses
from typing import Callable

import numpy as np

from .dense import GEMV_BELOW
from .plan import Plan, batch_features, nonzero_fractions

#: Below this matrix size (bytes) the matrix sits in the CPU caches, scoring is not memory-bound, and BLAS (tuned
#: for compute) is at least as fast as the compiled kernel: ``'auto'`` scores densely.
MIN_PRUNED_BYTES = 16 * 2 ** 20


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Estimated cost of each path in units of one dense ``gemv`` with top-k over the same matrix.

    - dense: fewer than ``GEMV_BELOW`` queries cost 1 each (one ``gemv`` each); from there one matrix product per
      batch costs ``dense_gemm_fixed + dense_gemm_per_query * queries``;
    - pruned, one query at a time (memory-bound: the kept rows are streamed once):
      ``pruned_fixed + pruned_slope * kept fraction`` per query;
    - pruned, a batch in one pass: ``batch_per_query * queries + batch_union * union fraction + batch_per_kept * sum
      of kept fractions``: each query's scores are cleared and pushed through its top-k, the union of the kept rows
      is read from memory once, every query's kept rows are re-read from the cache.
    """
    dense_gemm_fixed: float
    dense_gemm_per_query: float
    pruned_fixed: float
    pruned_slope: float
    batch_per_query: float
    batch_union: float
    batch_per_kept: float

    def dense_cost(self, queries: int) -> float:
        """Estimated cost of scoring ``queries`` queries on the dense path."""
        if queries < GEMV_BELOW:
            return float(queries)
        return self.dense_gemm_fixed + self.dense_gemm_per_query * queries

    def pruned_one_by_one_cost(self, query_vecs: np.ndarray) -> float:
        """Estimated cost of the pruned path one query at a time."""
        return float(np.sum(self.pruned_fixed + self.pruned_slope * nonzero_fractions(query_vecs)))

    def pruned_batch_cost(self, query_vecs: np.ndarray) -> float:
        """Estimated cost of the pruned path for the whole batch in one pass."""
        return float(np.dot((self.batch_per_query, self.batch_union, self.batch_per_kept), batch_features(query_vecs)))

    def batch_in_one_pass(self, query_vecs: np.ndarray) -> bool:
        """Whether the pruned path should score these queries in one pass rather than one by one."""
        return len(query_vecs) > 1 and self.pruned_batch_cost(query_vecs) < self.pruned_one_by_one_cost(query_vecs)

    def pruned_cost(self, query_vecs: np.ndarray) -> float:
        """Estimated cost of the pruned path (the cheaper of one by one and one pass)."""
        return min(self.pruned_one_by_one_cost(query_vecs), self.pruned_batch_cost(query_vecs))

    def prefers_pruned(self, query_vecs: np.ndarray) -> bool:
        """Whether the pruned path is estimated cheaper than the dense one for these queries (no margin: near the
        break-even either path costs about the same, and a margin would lose its own size on every query there)."""
        return self.pruned_cost(query_vecs) < self.dense_cost(len(query_vecs))


def plan(query_vecs: np.ndarray, *, strategy: str, matrix_bytes: int, compiled: bool,
         model: Callable[[], CostModel]) -> Plan:
    """The plan of one call for these pruned query vectors (n, dims) over a matrix of ``matrix_bytes``, decided once:

    - ``'dense'`` and ``'compressed'`` are taken as they are (a batch on the compressed path is scored query after
      query);
    - ``'pruned'``: one query, or a batch without the compiled kernel (the numpy path scores query after query),
      ``Plan('pruned')``; a batch over a matrix under ``MIN_PRUNED_BYTES`` (read from the caches either way) in one
      pass; else one pass where ``model()`` finds it cheaper than query after query;
    - ``'auto'``: dense without the compiled kernel (the numpy fallback is slower than BLAS beyond ~30 % kept), for a
      matrix under ``MIN_PRUNED_BYTES`` and for no queries; else the cheaper of dense and pruned by ``model()``.

    ``model`` (e.g. :func:`.calibration.model`, which calibrates on first use) is called only when the plan depends on
    it. The compressed path is never chosen by ``'auto'``: see ``pt_docs/speed.rst``."""
    if strategy in ('dense', 'compressed'):
        return Plan(strategy)
    batch = compiled and len(query_vecs) > 1
    if strategy == 'pruned':
        if not batch:
            return Plan('pruned')
        return Plan('one pass' if matrix_bytes < MIN_PRUNED_BYTES or model().batch_in_one_pass(query_vecs)
                    else 'pruned')
    if strategy != 'auto':
        raise ValueError(f"unknown strategy {strategy!r}; expected 'auto', 'pruned', 'dense' or 'compressed'")
    if not compiled or matrix_bytes < MIN_PRUNED_BYTES or not len(query_vecs):
        return Plan('dense')
    fitted = model()
    if not fitted.prefers_pruned(query_vecs):
        return Plan('dense')
    return Plan('one pass' if batch and fitted.batch_in_one_pass(query_vecs) else 'pruned')
