"""The cost model behind ``PrunedRetriever(strategy='auto')``: estimated time of each scoring path, in units of one
dense ``gemv`` over the whole matrix (one query, every dimension, top-k included), from the kept fraction of each
query. Fitted on the benchmark (``python benchmarks/run.py search --fit``; 1M x 768 float32, both paths on the same
one or two threads of a shared 2-core AVX-512 machine); where the fits with one and two threads differ, the constants
take the side that favours the dense path, so that ``'auto'`` errs towards it. Pure numpy."""
import numpy as np

#: Below this matrix size (bytes) the matrix sits in the CPU caches, scoring is not memory-bound, and BLAS (tuned
#: for compute) is at least as fast as the compiled kernel: ``'auto'`` scores densely.
MIN_PRUNED_BYTES = 16 * 2 ** 20
#: Dense path: fewer than ``GEMV_BELOW`` queries are scored one ``gemv`` each (cost 1 each); from there one matrix
#: product per batch costs ``DENSE_GEMM_FIXED + DENSE_GEMM_PER_QUERY`` per query.
GEMV_BELOW = 4
DENSE_GEMM_FIXED, DENSE_GEMM_PER_QUERY = 1.7, 0.15
#: Pruned path, one query at a time (memory-bound: the kept rows are streamed once):
#: ``PRUNED_FIXED + PRUNED_SLOPE * kept fraction`` per query.
PRUNED_FIXED, PRUNED_SLOPE = 0.05, 0.85
#: Pruned path, a batch in one pass (the union of the kept rows is read once and every query's kept rows are
#: re-read from the cache): ``BATCH_UNION * union fraction + BATCH_PER_QUERY * sum of kept fractions``.
BATCH_UNION, BATCH_PER_QUERY = 1.2, 0.23
#: ``'auto'`` takes the pruned path only when its estimate is below this fraction of the dense one: a margin for
#: the model's error, so that ``'auto'`` is not slower than dense near the break-even.
MARGIN = 0.9


def nonzero_fractions(query_vecs: np.ndarray) -> np.ndarray:
    """The fraction of non-zero dimensions of each query vector (n, dims)."""
    return np.mean(query_vecs != 0, axis=1)


def dense_cost(queries: int) -> float:
    """Estimated cost of scoring ``queries`` queries on the dense path."""
    return float(queries) if queries < GEMV_BELOW else DENSE_GEMM_FIXED + DENSE_GEMM_PER_QUERY * queries


def pruned_one_by_one_cost(query_vecs: np.ndarray) -> float:
    """Estimated cost of the pruned path one query at a time."""
    return float(np.sum(PRUNED_FIXED + PRUNED_SLOPE * nonzero_fractions(query_vecs)))


def pruned_batch_cost(query_vecs: np.ndarray) -> float:
    """Estimated cost of the pruned path for the whole batch in one pass."""
    union = float(np.mean((query_vecs != 0).any(axis=0))) if len(query_vecs) else 0.0
    return BATCH_UNION * union + BATCH_PER_QUERY * float(np.sum(nonzero_fractions(query_vecs)))


def batch_in_one_pass(query_vecs: np.ndarray) -> bool:
    """Whether the pruned path should score these queries in one pass rather than one by one."""
    return len(query_vecs) > 1 and pruned_batch_cost(query_vecs) < pruned_one_by_one_cost(query_vecs)


def pruned_cost(query_vecs: np.ndarray) -> float:
    """Estimated cost of the pruned path (the cheaper of one by one and one pass)."""
    return min(pruned_one_by_one_cost(query_vecs), pruned_batch_cost(query_vecs))


def choose_path(query_vecs: np.ndarray, matrix_bytes: int, compiled: bool) -> str:
    """``'pruned'`` or ``'dense'``: the path ``strategy='auto'`` takes for these pruned query vectors (n, dims) over
    a matrix of ``matrix_bytes``; always ``'dense'`` without the compiled kernel (the numpy fallback of the pruned
    path is slower than BLAS beyond ~30 % kept) and for a matrix under ``MIN_PRUNED_BYTES``."""
    if not compiled or matrix_bytes < MIN_PRUNED_BYTES or not len(query_vecs):
        return 'dense'
    return 'pruned' if pruned_cost(query_vecs) < MARGIN * dense_cost(len(query_vecs)) else 'dense'
