"""The pruned path: exact top-k inner-product search over a dimension-major ``(dims, docs)`` float32 matrix that reads
only the rows a query keeps (non-zero), by the compiled kernel (:mod:`._numba`, loaded on first use) or numpy."""
import importlib.util
from typing import Optional

import numpy as np

from .dense import Result, ranked, top_k

#: Whether the compiled kernel can run (tests set it to False); found without importing numba (~0.5 s).
NUMBA_AVAILABLE = importlib.util.find_spec('numba') is not None


def search_pruned(dim_major: np.ndarray, query_vecs: np.ndarray, k: int, *, one_pass: bool = False,
                  use_numba: Optional[bool] = None) -> Result:
    """Top-``k`` ``(scores, docids)`` of each query from the rows of ``dim_major`` where it is non-zero: numba's fused
    kernel when ``use_numba`` (default: when installed; with ``one_pass``, the plan ``'one pass'`` of
    :func:`.planner.choose`, the batch in one pass over the union of its rows), else :func:`numpy_top_k`."""
    if dim_major.dtype != np.float32 or not dim_major.flags.c_contiguous:
        raise ValueError('the dimension-major matrix must be a C-contiguous float32 (dims, docs) array, got '
                         f'{dim_major.dtype} with flags C={dim_major.flags.c_contiguous}')
    query_vecs = np.ascontiguousarray(query_vecs, dtype=np.float32)
    if not len(query_vecs):
        return [], []
    if query_vecs.ndim != 2 or query_vecs.shape[1] != dim_major.shape[0]:
        raise ValueError(f'query vectors of shape {query_vecs.shape} do not match a matrix of {dim_major.shape[0]} '
                         'dimensions')
    if use_numba is None:
        use_numba = NUMBA_AVAILABLE
    if use_numba:
        from . import _numba
        return _numba.fused_top_k(dim_major, query_vecs, k, one_pass=one_pass)
    return numpy_top_k(dim_major, query_vecs, k)


def numpy_top_k(dim_major: np.ndarray, query_vecs: np.ndarray, k: int, *, block: int = 32768) -> Result:
    """The pruned path without numba: per query and block of documents, the kept rows times the kept values, the
    blocks' top-k merged. The kernel's ranking (ties: lower docid); slower than dense beyond ~30 % kept, so
    ``strategy='auto'`` never takes it."""
    n_dims, n_docs = dim_major.shape
    k = min(k, n_docs)
    block = max(block, k)
    found = []
    for query_vec in query_vecs:
        kept = np.flatnonzero(query_vec)
        weights = query_vec[kept]
        best_s, best_i = np.empty(0, dtype=np.float32), np.empty(0, dtype=np.int64)
        for d0 in range(0, n_docs, block):
            block_scores = weights @ dim_major[kept, d0:d0 + block] if len(kept) else \
                np.zeros(min(block, n_docs - d0), dtype=np.float32)
            s, i = top_k(block_scores, k, offset=d0)
            best_s, best_i = np.concatenate([best_s, s]), np.concatenate([best_i, i])
        found.append((best_s, best_i))
    return ranked(found, k)
