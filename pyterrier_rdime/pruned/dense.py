"""What every scoring path shares: the kept dimensions of the queries (and which rows extend one another), top-k
selection (higher score first, exact ties to the lower docid), the int8 product; and the dense path: top-k
inner-product search over every dimension with BLAS, the reference the pruned paths match. BLAS's float32 sums depend
on the batch, so the top-k is re-scored in float64 and ranked rounded to float32. Pure numpy."""
import importlib.util
from typing import Iterable, List, Set, Tuple

import numpy as np

from .. import store
from .._config import cpu_info

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
    documents (16k-64k is fastest for OpenBLAS). With ``rows``, ``dim_major`` is the ``(docs, dims)`` rows instead;
    a float32 memory map of them is read block by block without filling the page cache (:func:`.store.row_reader`)
    and its found rows re-scored without read-ahead (:func:`.store.random_rows`): a pass over an 8.8M index's
    ``vecs.f4`` left the whole file cached and the int8 copy beside it evicted, which the next search read again."""
    query_vecs = np.ascontiguousarray(query_vecs, dtype=np.float32)
    if rows:
        docs = dim_major.shape[0]
        k = min(k, docs)
        with store.row_reader(dim_major) as read:
            found = _search_blocks(lambda d0: read(d0, min(docs, d0 + doc_block)),
                                   lambda queries, block: (block @ queries.T).T, docs, query_vecs, k, batch_size,
                                   doc_block)[1]
        scattered = store.random_rows(dim_major)
        return _rescored(lambda docids: scattered[docids], query_vecs, found, k)
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


def int8_product(flags: Set[str]) -> str:
    """How the compressed one pass multiplies int8 on a CPU with these ``/proc/cpuinfo`` flags: ``'torch'`` where it
    has int8 dot-product instructions (VNNI, AMX), else ``'float64'`` (exact; 25x faster than torch's on AVX2 alone)."""
    return 'torch' if flags & {'avx512_vnni', 'amx_int8'} and importlib.util.find_spec('torch') else 'float64'


INT8_PRODUCT = int8_product(set(cpu_info().get('flags', '').split()))
#: One row-add of the nested kernel per document, in multiply-adds of :data:`INT8_PRODUCT` (measured on a 2-core AMD
#: EPYC Zen 3: ~1.5 of the float64 product's; 8 for torch's on VNNI / AMX, estimated): a tree of rows is scored by
#: prefix sums when this times its row-adds is below its product's ``2 x rows x dims`` (:func:`nested_trees`).
NESTED_ADD_COST = 8 if INT8_PRODUCT == 'torch' else 1.5


def nested_trees(query_vecs: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(roots, rows, parents)`` of a batch: its rows that extend one another, scored by prefix sums. A row's parent
    is the largest other row whose every kept value it keeps bit for bit (ties: the lower row); rows under one root
    share one integer step. ``rows``: those scored so (trees whose :data:`NESTED_ADD_COST` pays), parents first;
    ``parents``: the position in ``rows`` of each one's parent (-1: a root); ``roots``: each row's root (or itself)."""
    vecs = np.asarray(query_vecs, dtype=np.float32)
    n, dims = vecs.shape
    kept, order, bits = vecs != 0, np.arange(n), vecs.view(np.uint32)
    sizes = kept.sum(axis=1)
    # a parent's candidates by a hash of each (dimension, value) below 2^53 / dims (exact sums in float64), checked
    mixed = (bits * np.uint64(0x9E3779B97F4A7C15) + np.arange(dims, dtype=np.uint64) * np.uint64(0xC2B2AE3D27D4EB4F)
             ) >> np.uint64(11 + dims.bit_length())
    own, parents = (kept * mixed.astype(np.float64)).sum(axis=1), order.copy()
    for child in np.array_split(order, -(-n // 256)):  # 256 children at a time: memory linear in the batch
        extends = ((kept @ kept[child].T.astype(np.float64) == sizes[:, None])
                   & (kept @ mixed[child].T.astype(np.float64) == own[:, None])
                   & ((sizes[:, None] < sizes[child]) | ((sizes[:, None] == sizes[child]) & (order[:, None] < child))))
        key = np.where(extends, sizes[:, None] * n + n - 1 - order[:, None], -1)  # below n: nothing kept
        parents[child] = np.where(key.max(axis=0) >= n, key.argmax(axis=0), child)
    roots = parents = np.where(((bits == bits[parents]) | ~kept[parents]).all(axis=1), parents, order)
    while not np.array_equal(roots[roots], roots):
        roots = roots[roots]
    adds = sizes - np.where(parents != order, sizes[parents], 0) + 1
    members = np.bincount(roots, minlength=n)
    pays = NESTED_ADD_COST * np.bincount(roots, weights=adds, minlength=n) < 2 * members * dims
    nested = pays[roots]
    rows = np.flatnonzero(nested)[np.lexsort((sizes[nested], roots[nested]))]  # parents first
    position = np.full(n, -1)
    position[rows] = np.arange(len(rows))
    return np.where(nested, roots, order), rows, np.where(parents[rows] != rows, position[parents[rows]], -1)
