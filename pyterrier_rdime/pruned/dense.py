"""What every scoring path shares: the kept dimensions of the queries and top-k selection (higher score first, exact
ties to the lower docid); and the dense path: top-k inner-product search over every dimension with BLAS, the reference
the pruned paths match. BLAS's float32 sums depend on the batch, so the top-k is re-scored in float64 and ranked
rounded to float32. Pure numpy."""
from typing import Iterable, List, Tuple

import numpy as np

Result = Tuple[List[np.ndarray], List[np.ndarray]]
#: Below this many queries, one ``gemv`` per query: a matrix product of 2-3 rows is slower than as many ``gemv``.
GEMV_BELOW = 4


def kept_dims(query_vecs: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The non-zero entries of each query, concatenated: ``(dims, weights, starts)`` with query ``i``'s kept dims
    (ascending) and values at ``starts[i]:starts[i + 1]``."""
    rows, dims = np.nonzero(query_vecs)
    starts = np.zeros(len(query_vecs) + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=len(query_vecs)), out=starts[1:])
    return dims.astype(np.int64), query_vecs[rows, dims].astype(np.float32), starts


def top_k(scores: np.ndarray, k: int, offset: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """The ``k`` highest of a 1-D score array, descending, ties by lower index: ``(scores, indices + offset)``."""
    idx = best_k(scores, np.arange(len(scores)), k)
    return scores[idx], idx + offset


def best_k(scores: np.ndarray, docids: np.ndarray, k: int) -> np.ndarray:
    """Positions of the ``k`` best ``(score, docid)`` pairs (higher score, then lower docid), in that order."""
    n = len(scores)
    if n > k:
        kth = np.partition(scores, n - k)[n - k]
        above = np.flatnonzero(scores > kth)
        ties = np.flatnonzero(scores == kth)
        keep = np.concatenate([above, ties[np.argsort(docids[ties], kind='stable')[:k - len(above)]]])
    else:
        keep = np.arange(n)
    return keep[np.lexsort((docids[keep], -scores[keep]))]


def ranked(found: Iterable[Tuple[np.ndarray, np.ndarray]], k: int) -> Result:
    """The best ``k`` of each query's ``(scores, docids)``, in the order of :func:`best_k`."""
    scores, docids = [], []
    for s, i in found:
        order = best_k(s, i, k)
        scores.append(s[order])
        docids.append(i[order])
    return scores, docids


def merge_heaps(heap_s: np.ndarray, heap_i: np.ndarray, k: int) -> Result:
    """The best ``k`` of each query over the chunks' heaps ``(chunks, queries, k)`` (unfilled slots have docid -1),
    descending, ties by lower docid."""
    heaps = [(heap_s[:, q].ravel(), heap_i[:, q].ravel()) for q in range(heap_s.shape[1])]
    return ranked([(s[i >= 0], i[i >= 0]) for s, i in heaps], k)


def search_dense(dim_major: np.ndarray, query_vecs: np.ndarray, k: int, *, batch_size: int = 64,
                 doc_block: int = 32768, rows: bool = False) -> Result:
    """Top-``k`` ``(scores, docids)`` of each query over every dimension with BLAS, over blocks of ``doc_block``
    documents (16k-64k is fastest for OpenBLAS). With ``rows``, ``dim_major`` is the ``(docs, dims)`` rows instead."""
    query_vecs = np.ascontiguousarray(query_vecs, dtype=np.float32)
    if rows:
        k = min(k, dim_major.shape[0])
        found = _search_blocks(lambda d0: np.asarray(dim_major[d0:d0 + doc_block], dtype=np.float32),
                               lambda queries, block: (block @ queries.T).T, dim_major.shape[0], query_vecs, k,
                               batch_size, doc_block)[1]
        return _rescored(lambda docids: dim_major[docids], query_vecs, found, k)
    dims, docs = dim_major.shape
    k = min(k, docs)
    if len(query_vecs) < GEMV_BELOW:
        found = [top_k(query_vec @ dim_major, k)[1] for query_vec in query_vecs]
    else:
        found = _search_blocks(lambda d0: dim_major[:, d0:d0 + doc_block], lambda queries, block: queries @ block,
                               docs, query_vecs, k, batch_size, doc_block)[1]
    return _rescored(lambda docids: dim_major[:, docids].T, query_vecs, found, k)


def _rescored(rows_of, query_vecs: np.ndarray, found: list, k: int) -> Result:
    """Each query's ``found`` documents (at most ``k``) re-scored in float64 row by row, rounded to float32, ranked."""
    exact = [(np.asarray(rows_of(docids), dtype=np.float64) * query_vec.astype(np.float64)).sum(axis=1)
             for query_vec, docids in zip(query_vecs, found)]
    return ranked([(scores.astype(np.float32), docids) for scores, docids in zip(exact, found)], k)


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
