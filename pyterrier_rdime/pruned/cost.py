"""The cost model behind ``strategy='auto'``, the prior of :mod:`.planner`: each path's time in units of one dense
``gemv`` over the matrix, from the fraction of dimensions each query keeps; constants from :mod:`.calibration`."""
import dataclasses
from typing import Dict

import numpy as np

from .dense import GEMV_BELOW
from .plan import batch_features, nonzero_fractions

#: Documents the compressed path re-scores exactly per result, as the model expects (measured ~1.1; margin added).
RESCORED_PER_RESULT = 1.5


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Estimated cost of each path in units of one dense ``gemv`` with top-k over the same matrix.

    - dense: 1 per query below ``GEMV_BELOW`` queries, else ``dense_gemm_fixed + dense_gemm_per_query * queries``;
    - pruned, query after query: ``pruned_fixed + pruned_slope * kept fraction`` per query;
    - pruned, one pass: ``batch_per_query * queries + batch_union * union fraction + batch_per_kept * sum of kept
      fractions``;
    - compressed: ``compressed_fixed + compressed_slope * kept fraction`` per query (one pass:
      ``compressed_pass_fixed + compressed_pass_per_query * queries``), plus :meth:`compressed_seconds` in units of
      one ``gemv`` (``gemv_seconds_per_byte`` times the matrix's size).
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
        """Estimated cost of the compressed path query after query, ``k`` results each."""
        scan = self.compressed_fixed + self.compressed_slope * nonzero_fractions(query_vecs)
        seconds = self.compressed_seconds(query_vecs, k, self.compressed_call_seconds)
        return float(np.sum(scan)) + seconds / (self.gemv_seconds_per_byte * matrix_bytes)

    def compressed_one_pass_cost(self, query_vecs: np.ndarray, k: int, matrix_bytes: int) -> float:
        """Estimated cost of the compressed path for the whole batch in one pass."""
        scan = self.compressed_pass_fixed + self.compressed_pass_per_query * len(query_vecs)
        seconds = self.compressed_seconds(query_vecs, k, self.compressed_pass_call_seconds)
        return scan + seconds / (self.gemv_seconds_per_byte * matrix_bytes)

    def compressed_seconds(self, query_vecs: np.ndarray, k: int, call_seconds: float) -> float:
        """A compressed path's seconds that do not grow with the matrix: per-query work and exact re-scoring."""
        values = RESCORED_PER_RESULT * k * nonzero_fractions(query_vecs) * query_vecs.shape[1]
        return float(np.sum(call_seconds + self.rescore_seconds * values))

    def path_costs(self, query_vecs: np.ndarray, *, k: int, matrix_bytes: int, one_pass: bool) -> Dict[str, float]:
        """Estimated cost of ``'dense'``, ``'pruned'``, ``'one pass'``, ``'compressed'`` and ``'compressed one pass'``
        (the one-pass paths only with ``one_pass``), in that order."""
        costs = {'dense': self.dense_cost(len(query_vecs)), 'pruned': self.pruned_one_by_one_cost(query_vecs)}
        if one_pass:
            costs['one pass'] = self.pruned_batch_cost(query_vecs)
        costs['compressed'] = self.compressed_cost(query_vecs, k, matrix_bytes)
        if one_pass:
            costs['compressed one pass'] = self.compressed_one_pass_cost(query_vecs, k, matrix_bytes)
        return costs

