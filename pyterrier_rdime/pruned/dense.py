"""The dense path: top-k inner-product search over every dimension of a dimension-major ``(dims, docs)`` float32
matrix with BLAS, the reference the pruned paths must match. Pure numpy."""
import numpy as np

from .topk import Result, best_k, top_k

#: Below this many queries, one ``gemv`` per query: a matrix product of 2-3 rows is slower than as many ``gemv``.
GEMV_BELOW = 4


def search_dense(dim_major: np.ndarray, query_vecs: np.ndarray, k: int, *, batch_size: int = 64,
                 doc_block: int = 32768) -> Result:
    """Top-``k`` ``(scores, docids)`` of each query scored over every dimension with BLAS: one ``gemv`` per query
    below ``GEMV_BELOW`` queries, else ``batch_size`` queries per matrix product over blocks of ``doc_block``
    documents (16k-64k is fastest: larger blocks slow OpenBLAS down), merging the top-k block by block."""
    dims, docs = dim_major.shape
    k = min(k, docs)
    scores, docids = [], []
    if len(query_vecs) < GEMV_BELOW:
        for query_vec in query_vecs:
            s, d = top_k(np.ascontiguousarray(query_vec, dtype=np.float32) @ dim_major, k)
            scores.append(s)
            docids.append(d)
        return scores, docids
    for q0 in range(0, len(query_vecs), batch_size):
        queries = np.ascontiguousarray(query_vecs[q0:q0 + batch_size], dtype=np.float32)
        best = [(np.empty(0, dtype=np.float32), np.empty(0, dtype=np.int64))] * len(queries)
        bar = np.full(len(queries), -np.inf, dtype=np.float32)  # the k-th best score so far, once k are known
        for d0 in range(0, docs, doc_block):
            block = queries @ dim_major[:, d0:d0 + doc_block]
            # after the first blocks only a few documents beat the k-th best: select among those alone
            rows, cols = np.nonzero(block > bar[:, None])
            bounds = np.searchsorted(rows, np.arange(len(queries) + 1))
            for q in np.flatnonzero(np.diff(bounds)):
                cand = cols[bounds[q]:bounds[q + 1]]
                s = np.concatenate([best[q][0], block[q, cand]])
                i = np.concatenate([best[q][1], cand + d0])
                if len(s) >= k:
                    keep = best_k(s, i, k)
                    s, i = s[keep], i[keep]
                    bar[q] = s[-1]
                best[q] = (s, i)
        for s, i in best:
            order = best_k(s, i, k)
            scores.append(s[order])
            docids.append(i[order])
    return scores, docids
