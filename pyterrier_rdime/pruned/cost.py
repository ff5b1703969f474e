"""The cost model behind ``PrunedRetriever(strategy='auto')``, the prior of :mod:`.planner`'s choice. It estimates
the time of each scoring path, in units of one dense ``gemv`` over the whole matrix (one query, every dimension, top-k
included), from the fraction of dimensions each query keeps. Its constants are calibrated on the machine in use, not
fitted once on another CPU (:mod:`.calibration`, the harness that times every path, fits and caches the constants).
Pure arithmetic."""
import dataclasses
from typing import Dict

import numpy as np

from .dense import GEMV_BELOW
from .plan import batch_features, nonzero_fractions

#: Documents the compressed path re-scores exactly per result asked for, as the cost model expects them: the ``k`` best
#: of the first pass and those its error bound cannot rule out. Measured means: 1.06-1.09 on the synthetic 1M x 768
#: index of the benchmarks (top-100), 1.11 / 1.07 / 1.17 for the top-10 / 100 / 1000 of MiniLM on the DL19 pool (at
#: most 1.6); a little more is assumed, as the bound is wider against the gaps of other data.
RESCORED_PER_RESULT = 1.5


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Estimated cost of each path in units of one dense ``gemv`` with top-k over the same matrix.

    - dense: fewer than ``GEMV_BELOW`` queries cost 1 each (one ``gemv`` each); from there one matrix product per
      batch costs ``dense_gemm_fixed + dense_gemm_per_query * queries``;
    - pruned, one query at a time (memory-bound: the kept rows are streamed once):
      ``pruned_fixed + pruned_slope * kept fraction`` per query;
    - pruned, a batch in one pass: ``batch_per_query * queries + batch_union * union fraction + batch_per_kept * sum
      of kept fractions``: each query's scores are cleared and pushed through its top-k, the union of the kept rows
      is read from memory once, every query's kept rows are re-read from the cache;
    - compressed, query after query: ``compressed_fixed + compressed_slope * kept fraction`` per query for the scan of
      the int8 copy (a quarter of the bytes of the float32 rows) and of its approximate scores, which grow with the
      matrix, plus what does not grow with it: the call's own work (``compressed_call_seconds``: the bound, the
      selections) and the exact re-scoring of ``RESCORED_PER_RESULT * k`` documents on their kept dimensions
      (``rescore_seconds`` per value read), turned into units by the time of one ``gemv``, ``gemv_seconds_per_byte``
      times the matrix's size;
    - compressed, a batch in one pass: ``compressed_pass_fixed + compressed_pass_per_query * queries`` for the int8
      matrix products over the whole copy and each query's share of pushing their integer scores into its best and
      candidates (both grow with the matrix), plus each query's re-scoring as above and its own work on the way
      (``compressed_pass_call_seconds``).
    """
    dense_gemm_fixed: float
    dense_gemm_per_query: float
    pruned_fixed: float
    pruned_slope: float
    batch_per_query: float
    batch_union: float
    batch_per_kept: float
    compressed_fixed: float
    compressed_slope: float
    compressed_call_seconds: float
    compressed_pass_fixed: float
    compressed_pass_per_query: float
    compressed_pass_call_seconds: float
    rescore_seconds: float
    gemv_seconds_per_byte: float

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

    def compressed_cost(self, query_vecs: np.ndarray, k: int, matrix_bytes: int) -> float:
        """Estimated cost of the compressed path query after query for these queries, ``k`` results each, over a
        matrix of ``matrix_bytes``."""
        scan = self.compressed_fixed + self.compressed_slope * nonzero_fractions(query_vecs)
        seconds = self.compressed_seconds(query_vecs, k, self.compressed_call_seconds)
        return float(np.sum(scan)) + seconds / (self.gemv_seconds_per_byte * matrix_bytes)

    def compressed_one_pass_cost(self, query_vecs: np.ndarray, k: int, matrix_bytes: int) -> float:
        """Estimated cost of the compressed path for the whole batch in one pass."""
        scan = self.compressed_pass_fixed + self.compressed_pass_per_query * len(query_vecs)
        seconds = self.compressed_seconds(query_vecs, k, self.compressed_pass_call_seconds)
        return scan + seconds / (self.gemv_seconds_per_byte * matrix_bytes)

    def compressed_seconds(self, query_vecs: np.ndarray, k: int, call_seconds: float) -> float:
        """The seconds of a compressed path that do not grow with the matrix: each query's own work (``call_seconds``)
        and exact re-scoring of ``RESCORED_PER_RESULT * k`` documents on its kept dimensions."""
        values = RESCORED_PER_RESULT * k * nonzero_fractions(query_vecs) * query_vecs.shape[1]
        return float(np.sum(call_seconds + self.rescore_seconds * values))

    def path_costs(self, query_vecs: np.ndarray, *, k: int, matrix_bytes: int, one_pass: bool) -> Dict[str, float]:
        """Estimated cost of each path for these queries, ``k`` results each, over a matrix of ``matrix_bytes``:
        ``'dense'``, ``'pruned'`` (query after query), ``'one pass'`` (only with ``one_pass``: a batch the compiled
        kernels can score in one pass), ``'compressed'`` (query after query) and ``'compressed one pass'`` (only with
        ``one_pass``), in that order."""
        costs = {'dense': self.dense_cost(len(query_vecs)), 'pruned': self.pruned_one_by_one_cost(query_vecs)}
        if one_pass:
            costs['one pass'] = self.pruned_batch_cost(query_vecs)
        costs['compressed'] = self.compressed_cost(query_vecs, k, matrix_bytes)
        if one_pass:
            costs['compressed one pass'] = self.compressed_one_pass_cost(query_vecs, k, matrix_bytes)
        return costs

