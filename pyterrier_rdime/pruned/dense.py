"""The dense path: top-k inner-product search over every dimension with BLAS, the reference the pruned paths match.
BLAS's float32 sums depend on the batch, so the top-k is re-scored in float64 and ranked rounded to float32."""
import numpy as np

from .topk import Result, best_k, ranked, top_k

#: Below this many queries, one ``gemv`` per query: a matrix product of 2-3 rows is slower than as many ``gemv``.
GEMV_BELOW = 4


def search_dense(dim_major: np.ndarray, query_vecs: np.ndarray, k: int, *, batch_size: int = 64,
                 doc_block: int = 32768, rows: bool = False) -> Result:
    """Top-``k`` ``(scores, docids)`` of each query over every dimension with BLAS, over blocks of ``doc_block``
    documents (16k-64k is fastest for OpenBLAS). With ``rows``, ``dim_major`` is the ``(docs, dims)`` rows instead."""
    query_vecs = np.ascontiguousarray(query_vecs, dtype=np.float32)
    if rows:
        docs = dim_major.shape[0]
        found = _search_blocks(lambda d0: np.asarray(dim_major[d0:d0 + doc_block], dtype=np.float32),
                               lambda queries, block: (block @ queries.T).T, docs, query_vecs, min(k, docs),
                               batch_size, doc_block)
        return _rescored(lambda docids: dim_major[docids], query_vecs, found[1])
    dims, docs = dim_major.shape
    k = min(k, docs)
    scores, docids = [], []
    if len(query_vecs) < GEMV_BELOW:
        for query_vec in query_vecs:
            s, d = top_k(query_vec @ dim_major, k)
            scores.append(s)
            docids.append(d)
    else:
        scores, docids = _search_blocks(lambda d0: dim_major[:, d0:d0 + doc_block],
                                        lambda queries, block: queries @ block, docs, query_vecs, k, batch_size,
                                        doc_block)
    return _rescored(lambda found: dim_major[:, found].T, query_vecs, docids)


def _rescored(rows_of, query_vecs: np.ndarray, docids) -> Result:
    """Each query's documents re-scored in float64 row by row, rounded to float32 and ranked."""
    scores, ranked = [], []
    for query_vec, found in zip(query_vecs, docids):
        exact = (np.asarray(rows_of(found), dtype=np.float64) * query_vec.astype(np.float64)).sum(axis=1)
        exact = exact.astype(np.float32)
        order = best_k(exact, found, len(found))
        scores.append(exact[order])
        ranked.append(found[order])
    return scores, ranked


def _search_blocks(read_block, product, docs: int, query_vecs: np.ndarray, k: int, batch_size: int,
                   doc_block: int) -> Result:
    """Top-``k`` of each query, each block read once and scored ``batch_size`` queries at a time."""
    best = [(np.empty(0, dtype=np.float32), np.empty(0, dtype=np.int64))] * len(query_vecs)
    bar = np.full(len(query_vecs), -np.inf, dtype=np.float32)  # the k-th best score so far, once k are known
    for d0 in range(0, docs, doc_block):
        data = read_block(d0)
        for q0 in range(0, len(query_vecs), batch_size):
            block = product(query_vecs[q0:q0 + batch_size], data)
            # after the first blocks only a few documents beat the k-th best: select among those alone
            rows, cols = np.nonzero(block > bar[q0:q0 + len(block), None])
            bounds = np.searchsorted(rows, np.arange(len(block) + 1))
            for q in np.flatnonzero(np.diff(bounds)):
                cand = cols[bounds[q]:bounds[q + 1]]
                s = np.concatenate([best[q0 + q][0], block[q, cand]])
                i = np.concatenate([best[q0 + q][1], cand + d0])
                if len(s) >= k:
                    keep = best_k(s, i, k)
                    s, i = s[keep], i[keep]
                    bar[q0 + q] = s[-1]
                best[q0 + q] = (s, i)
    return ranked(best, k)
