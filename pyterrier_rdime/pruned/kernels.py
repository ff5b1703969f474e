"""Exact top-k inner-product search over a dimension-major ``(dims, docs)`` float32 matrix: the dense path (BLAS over
every dimension), a fused compiled kernel reading only the kept dimensions of each query (numba), and a pure-numpy
version of the latter for machines without numba. No pandas here."""
import math
import os
import threading
from typing import List, Optional, Tuple

import numpy as np

from . import cost

try:
    import numba
except ImportError:  # pragma: no cover - numba is a dependency; the fallback is tested by forcing it
    numba = None

#: Whether the compiled kernel can run (set to False to force the numpy fallback, as the tests do).
NUMBA_AVAILABLE = numba is not None

#: Documents per block of the score vector for one query: the block's scores (64 KiB) stay in the L2 cache while
#: every kept row adds to them, and each row segment read is long enough (64 KiB) for the hardware prefetcher.
BLOCK_DOCS = 16384
#: Dimensions per tile for a batch: a tile of ``TILE_DIMS x block`` values is read from memory once and re-used from
#: the cache by every query of the batch.
TILE_DIMS = 16
#: For a batch, the block is narrowed until a tile and the scores of every query, ``(TILE_DIMS + queries) x block``
#: floats, fit in this many floats (768 KiB: most of a 1 MiB L2 cache).
BATCH_CACHE_FLOATS = 196608
#: Document blocks per thread: more, smaller chunks balance the work when another process takes a core.
CHUNKS_PER_THREAD = 4

Result = Tuple[List[np.ndarray], List[np.ndarray]]

# The OpenMP and TBB threading layers accept concurrent calls, numba's own workqueue layer aborts on them; the kernel
# already uses every core, so concurrent calls from Python threads are simply served one after the other.
_KERNEL_LOCK = threading.Lock()
# GNU OpenMP cannot run in a process forked after it started (numba then terminates the child): a child forked after
# the parallel kernel ran on that layer (multiprocessing's default on Linux) scores on one thread instead.
_PARALLEL = {'layer': None, 'forked': False}


def _after_fork_in_child() -> None:
    if _PARALLEL['layer'] == 'omp':
        _PARALLEL['forked'] = True


if hasattr(os, 'register_at_fork'):
    os.register_at_fork(after_in_child=_after_fork_in_child)


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


def search_dense(dim_major: np.ndarray, query_vecs: np.ndarray, k: int, *, batch_size: int = 64,
                 doc_block: int = 32768) -> Result:
    """Top-``k`` ``(scores, docids)`` of each query scored over every dimension with BLAS (the reference the pruned
    paths must match): one ``gemv`` per query for fewer than 4 queries (a matrix product of 2-3 rows is slower than as
    many ``gemv``), else ``batch_size`` queries per matrix product over blocks of ``doc_block`` documents (16k-64k is
    fastest: larger blocks slow OpenBLAS down), merging the top-k block by block."""
    dims, docs = dim_major.shape
    k = min(k, docs)
    scores, docids = [], []
    if len(query_vecs) < 4:
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


def search_pruned(dim_major: np.ndarray, query_vecs: np.ndarray, k: int, *,
                  use_numba: Optional[bool] = None) -> Result:
    """Top-``k`` ``(scores, docids)`` of each query, reading only the rows of ``dim_major`` where the query is
    non-zero (exact: a zero entry adds nothing). With numba, one fused parallel pass per batch (see
    :func:`fused_top_k`); else :func:`numpy_top_k`. ``use_numba=None`` uses numba when it is available."""
    dim_major = _check_matrix(dim_major)
    query_vecs = np.ascontiguousarray(query_vecs, dtype=np.float32)
    if not len(query_vecs):
        return [], []
    if query_vecs.ndim != 2 or query_vecs.shape[1] != dim_major.shape[0]:
        raise ValueError(f'query vectors of shape {query_vecs.shape} do not match a matrix of {dim_major.shape[0]} '
                         'dimensions')
    if use_numba is None:
        use_numba = NUMBA_AVAILABLE
    if use_numba:
        return fused_top_k(dim_major, query_vecs, k)
    return numpy_top_k(dim_major, query_vecs, k)


def kept_dims(query_vecs: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The non-zero entries of each query, concatenated: ``(dims, weights, starts)`` with query ``i``'s kept dims
    (ascending) and values at ``starts[i]:starts[i + 1]``."""
    rows, dims = np.nonzero(query_vecs)
    starts = np.zeros(len(query_vecs) + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=len(query_vecs)), out=starts[1:])
    return dims.astype(np.int64), query_vecs[rows, dims].astype(np.float32), starts


def fused_top_k(dim_major: np.ndarray, query_vecs: np.ndarray, k: int, *, one_pass: Optional[bool] = None) -> Result:
    """The compiled path of :func:`search_pruned`. The documents are cut into chunks, the tasks of a parallel loop
    (several per thread, for balance when another process takes a core); a chunk is scored block by block, each
    block's scores held in the cache while the kept rows are added to them (eight rows per pass over the block), then
    pushed into the chunk's top-k heap. A batch is scored either one query after the other (each streams only its
    kept rows) or in one pass (``one_pass``, chosen by the cost model when None): blocks narrow enough for the scores
    of every query to stay in the L2 cache, rows taken in tiles of ``TILE_DIMS`` dimensions that every query re-reads
    from the cache, so the matrix is read from memory once per batch. The chunks' heaps are merged at the end."""
    if one_pass is None:
        one_pass = cost.batch_in_one_pass(query_vecs)
    if len(query_vecs) > 1 and not one_pass:
        results = [fused_top_k(dim_major, query_vec[None], k, one_pass=True) for query_vec in query_vecs]
        return [r[0][0] for r in results], [r[1][0] for r in results]
    n_dims, n_docs = dim_major.shape
    k = min(k, n_docs)
    n_queries = len(query_vecs)
    dims, weights, starts = kept_dims(query_vecs)
    block = BLOCK_DOCS
    while n_queries > 1 and block > 1024 and block * (TILE_DIMS + n_queries) > BATCH_CACHE_FLOATS:
        block //= 2
    tile = n_dims if n_queries == 1 else TILE_DIMS
    if _PARALLEL['forked']:
        kernel, threads = _serial_kernel(), 1
    else:
        kernel, threads = _fused_kernel, numba.get_num_threads()
    chunks = max(1, min(math.ceil(n_docs / block), CHUNKS_PER_THREAD * threads))
    with _KERNEL_LOCK:
        heap_s, heap_i = kernel(dim_major, dims, weights, starts, k, block, tile, chunks)
        if _PARALLEL['layer'] is None and not _PARALLEL['forked']:
            _PARALLEL['layer'] = numba.threading_layer()
    return _merge(heap_s, heap_i, k)


def numpy_top_k(dim_major: np.ndarray, query_vecs: np.ndarray, k: int, *, block: int = 32768) -> Result:
    """The pure-numpy path of :func:`search_pruned`, for machines without numba: per query and block of documents,
    the kept rows of the block are gathered (a small copy) and multiplied by the kept values; the blocks' top-k are
    merged. Same ranking as the compiled kernel (ties by lower docid), slower than the dense path beyond ~30 % kept
    (the gathered copy is written and read again), which is why ``strategy='auto'`` never takes it."""
    n_dims, n_docs = dim_major.shape
    k = min(k, n_docs)
    block = max(block, k)
    scores, docids = [], []
    for query_vec in query_vecs:
        kept = np.flatnonzero(query_vec)
        weights = query_vec[kept]
        best_s, best_i = np.empty(0, dtype=np.float32), np.empty(0, dtype=np.int64)
        for d0 in range(0, n_docs, block):
            block_scores = weights @ dim_major[kept, d0:d0 + block] if len(kept) else \
                np.zeros(min(block, n_docs - d0), dtype=np.float32)
            s, i = top_k(block_scores, k, offset=d0)
            best_s, best_i = np.concatenate([best_s, s]), np.concatenate([best_i, i])
        order = best_k(best_s, best_i, k)
        scores.append(best_s[order])
        docids.append(best_i[order])
    return scores, docids


def _merge(heap_s: np.ndarray, heap_i: np.ndarray, k: int) -> Result:
    """The best ``k`` of the chunks' heaps ``(chunks, queries, k)`` of each query, descending, ties by lower docid."""
    scores, docids = [], []
    for q in range(heap_s.shape[1]):
        s, i = heap_s[:, q].ravel(), heap_i[:, q].ravel()
        filled = i >= 0
        s, i = s[filled], i[filled]
        order = best_k(s, i, k)
        scores.append(s[order])
        docids.append(i[order])
    return scores, docids


def _check_matrix(dim_major: np.ndarray) -> np.ndarray:
    if dim_major.dtype != np.float32 or not dim_major.flags.c_contiguous:
        raise ValueError('the dimension-major matrix must be a C-contiguous float32 (dims, docs) array, got '
                         f'{dim_major.dtype} with flags C={dim_major.flags.c_contiguous}')
    return dim_major


if numba is not None:
    _jit = numba.njit(cache=True, nogil=True, fastmath={'contract'})
    _parallel_jit = numba.njit(parallel=True, cache=True, nogil=True, fastmath={'contract'})
    _prange = numba.prange
else:  # pragma: no cover - the kernel is then never called
    def _jit(fn):
        return fn
    _parallel_jit, _prange = _jit, range


@_jit
def _worse(s_a, i_a, s_b, i_b):
    # heap order: the root is the worst kept document (lowest score, then highest docid)
    return s_a < s_b or (s_a == s_b and i_a > i_b)


@_jit
def _replace_root(heap_s, heap_i, s, i):
    k = heap_s.shape[0]
    pos = 0
    while True:
        child = 2 * pos + 1
        if child >= k:
            break
        if child + 1 < k and _worse(heap_s[child + 1], heap_i[child + 1], heap_s[child], heap_i[child]):
            child += 1
        if _worse(heap_s[child], heap_i[child], s, i):
            heap_s[pos] = heap_s[child]
            heap_i[pos] = heap_i[child]
            pos = child
        else:
            break
    heap_s[pos] = s
    heap_i[pos] = i


@_jit
def _push_block(heap_s, heap_i, scores, n, first_docid):
    # docids grow within a chunk, so a document tying with the root loses (ties go to the lower docid)
    bar = heap_s[0]
    for t in range(n):
        if scores[t] > bar:
            _replace_root(heap_s, heap_i, scores[t], first_docid + t)
            bar = heap_s[0]


@_jit
def _add_rows(acc, matrix, dims, weights, j, stop, b0, n):
    # acc[:n] += weights[r] * matrix[dims[r], b0:b0 + n] for r in [j, stop): eight rows per pass over acc, so that
    # the block of scores is read and written once per eight rows
    while j + 8 <= stop:
        r0, r1 = matrix[dims[j], b0:b0 + n], matrix[dims[j + 1], b0:b0 + n]
        r2, r3 = matrix[dims[j + 2], b0:b0 + n], matrix[dims[j + 3], b0:b0 + n]
        r4, r5 = matrix[dims[j + 4], b0:b0 + n], matrix[dims[j + 5], b0:b0 + n]
        r6, r7 = matrix[dims[j + 6], b0:b0 + n], matrix[dims[j + 7], b0:b0 + n]
        w0, w1, w2, w3 = weights[j], weights[j + 1], weights[j + 2], weights[j + 3]
        w4, w5, w6, w7 = weights[j + 4], weights[j + 5], weights[j + 6], weights[j + 7]
        for t in range(n):
            acc[t] += (w0 * r0[t] + w1 * r1[t] + w2 * r2[t] + w3 * r3[t]
                       + w4 * r4[t] + w5 * r5[t] + w6 * r6[t] + w7 * r7[t])
        j += 8
    if j + 4 <= stop:
        r0, r1 = matrix[dims[j], b0:b0 + n], matrix[dims[j + 1], b0:b0 + n]
        r2, r3 = matrix[dims[j + 2], b0:b0 + n], matrix[dims[j + 3], b0:b0 + n]
        w0, w1, w2, w3 = weights[j], weights[j + 1], weights[j + 2], weights[j + 3]
        for t in range(n):
            acc[t] += w0 * r0[t] + w1 * r1[t] + w2 * r2[t] + w3 * r3[t]
        j += 4
    while j < stop:
        r0, w0 = matrix[dims[j], b0:b0 + n], weights[j]
        for t in range(n):
            acc[t] += w0 * r0[t]
        j += 1


@_parallel_jit
def _fused_kernel(matrix, dims, weights, starts, k, block, tile, chunks):
    n_dims, n_docs = matrix.shape
    n_queries = starts.shape[0] - 1
    heap_s = np.full((chunks, n_queries, k), -np.inf, dtype=np.float32)
    heap_i = np.full((chunks, n_queries, k), -1, dtype=np.int64)
    per_chunk = (n_docs + chunks - 1) // chunks
    per_chunk = (per_chunk + block - 1) // block * block
    for c in _prange(chunks):
        acc = np.empty((n_queries, block), dtype=np.float32)
        cursor = np.empty(n_queries, dtype=np.int64)
        lo = c * per_chunk
        hi = min(n_docs, lo + per_chunk)
        for b0 in range(lo, hi, block):
            n = min(hi, b0 + block) - b0
            acc[:, :n] = 0.0
            cursor[:] = starts[:n_queries]
            for tile_end in range(tile, n_dims + tile, tile):
                for q in range(n_queries):
                    j = cursor[q]
                    stop = j
                    while stop < starts[q + 1] and dims[stop] < tile_end:
                        stop += 1
                    _add_rows(acc[q], matrix, dims, weights, j, stop, b0, n)
                    cursor[q] = stop
            for q in range(n_queries):
                _push_block(heap_s[c, q], heap_i[c, q], acc[q], n, b0)
    return heap_s, heap_i


_SERIAL = []


def _serial_kernel():
    """The kernel compiled without the parallel loop (for a forked child; not cached on disk, where it would share
    the parallel kernel's entry)."""
    if not _SERIAL:
        _SERIAL.append(numba.njit(nogil=True, fastmath={'contract'})(_fused_kernel.py_func))
    return _SERIAL[0]
