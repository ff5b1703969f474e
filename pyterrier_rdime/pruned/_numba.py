"""The compiled pruned path (numba), imported only when it first runs: a fused parallel kernel that reads only the
kept rows of a dimension-major ``(dims, docs)`` float32 matrix (or its int8 copy, for the compressed path's first
pass) and keeps a running top-k per chunk of documents."""
import contextlib
import math
import threading

import numba
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from .._config import fork_guard
from .dense import Result, kept_dims, merge_heaps

#: Documents per block of one query's scores: 64 KiB, held in L2 while every kept row adds to them.
BLOCK_DOCS = 16384
#: Dimensions per tile for a batch: read from memory once, re-used from the cache by every query.
TILE_DIMS = 32
#: For a batch, ``(TILE_DIMS + queries) x block`` floats must fit in this many (768 KiB: most of a 1 MiB L2).
BATCH_CACHE_FLOATS = 196608
#: Document blocks per thread: more, smaller chunks balance the work when another process takes a core.
CHUNKS_PER_THREAD = 4

# The OpenMP and TBB threading layers accept concurrent calls, numba's own workqueue layer aborts on them; the kernel
# already uses every core, so concurrent calls from Python threads are simply served one after the other.
_KERNEL_LOCK = threading.Lock()
# GNU OpenMP cannot run in a process forked after it started (numba then terminates the child): a child forked after
# the parallel kernel ran on that layer (multiprocessing's default on Linux) scores on one thread instead.
_PARALLEL = {'layer': None}
_FORKED = fork_guard(lambda: _PARALLEL['layer'] == 'omp')


def fused_top_k(dim_major: np.ndarray, query_vecs: np.ndarray, k: int, *, one_pass: bool) -> Result:
    """The compiled path of :func:`.kept.search_pruned`: parallel chunks of documents, each scored block by block in
    the cache and pushed into the chunk's top-k heap. With ``one_pass`` a batch shares tiles of ``TILE_DIMS`` rows, so
    the matrix is read from memory once per batch."""
    if len(query_vecs) > 1 and not one_pass:
        results = [fused_top_k(dim_major, query_vec[None], k, one_pass=True) for query_vec in query_vecs]
        return [r[0][0] for r in results], [r[1][0] for r in results]
    return _fused(dim_major, *kept_dims(query_vecs), k, np.empty(0, dtype=np.float32))


def approximate_top_k(codes: np.ndarray, dims: np.ndarray, weights: np.ndarray, k: int):
    """The compressed path's first pass for one query: ``(approx, docids)``, the float32 score ``sum_r weights[r] *
    codes[dims[r], d]`` of every document and the ``k`` best docids."""
    approx = np.empty(codes.shape[1], dtype=np.float32)
    return approx, _fused(codes, dims, weights, np.array([0, len(dims)], dtype=np.int64), k, approx)[1][0]


def _fused(matrix: np.ndarray, dims: np.ndarray, weights: np.ndarray, starts: np.ndarray, k: int,
           approx: np.ndarray) -> Result:
    """:func:`_fused_kernel` of the queries whose kept ``dims`` and ``weights`` start at ``starts``, on as many
    chunks as the threads balance; one query's scores are also written to ``approx`` unless it is empty."""
    n_dims, n_docs = matrix.shape
    k = min(k, n_docs)
    n_queries = len(starts) - 1
    block = BLOCK_DOCS
    while n_queries > 1 and block > 1024 and block * (TILE_DIMS + n_queries) > BATCH_CACHE_FLOATS:
        block //= 2
    tile = n_dims if n_queries == 1 else TILE_DIMS
    kernel, threads = _runnable(_fused_kernel)
    chunks = max(1, min(math.ceil(n_docs / block), CHUNKS_PER_THREAD * threads))
    with _running():
        heap_s, heap_i = kernel(matrix, dims, weights, starts, k, block, tile, chunks, approx)
    return merge_heaps(heap_s, heap_i, k)


#: Candidates buffered per result by :func:`integer_candidates` at first (at least ``MIN_CANDIDATES``); a full buffer
#: doubles, while every buffer together holds at most ``MAX_CANDIDATES`` (128 MiB).
CANDIDATES_PER_RESULT = 4
MIN_CANDIDATES = 4096
MAX_CANDIDATES = 2 ** 24
#: The one pass ranks a document by one int64 key, ``score * 2**32 + ID_MAX - docid``: by its integer score
#: (``|score| < 2 ** 31``), ties to the lower docid (``docid < ID_MAX``); ``NO_DOCUMENT`` is below every key.
ID_MAX = 2 ** 32 - 1
NO_DOCUMENT = np.iinfo(np.int64).min
#: Keys entering a top-k one by one (into their places in the ordered top), at most ``k // FEW_ENTER``; more: one
#: selection. Once the k-th best settles a slab brings a few, and a selection reads all k for them: on a Zen 3, a
#: 320-row call's push over 1M documents took 1.6-2.1 ms per slab (median) one by one, 2.5-2.7 ms by selection.
FEW_ENTER = 32


def integer_candidates(codes: np.ndarray, slabs, prefix_sums, base: int, source: np.ndarray, k: int,
                       slack: np.ndarray):
    """The compiled :func:`.compressed.integer_candidates` over ``slabs`` (``(d0, parts)``: the product rows' scores
    ``base * high + low``) and the rows scored by ``prefix_sums`` (``(dims, weights, starts, parents)`` of each one's
    own dims, parents first), query ``q``'s at row ``source[q]`` (the product rows, then these): per query its ``k``
    best documents and a buffer of candidates within ``slack[q]`` of its k-th best. A buffer still full after
    compaction stops its query's push; it doubles and the push resumes there (the slab's scores are still at hand),
    until ``MAX_CANDIDATES``: then the query overflows and stops (no results: it runs on its own)."""
    n_queries = len(source)
    room = np.full(n_queries, max(CANDIDATES_PER_RESULT * k, MIN_CANDIDATES), dtype=np.int64)
    start = np.arange(n_queries, dtype=np.int64) * room  # of each query's buffer in the pool
    pool = np.empty(room.sum(), dtype=np.int64)  # the keys of the candidates, in docid order
    used = len(pool)
    top = np.full((n_queries, k), NO_DOCUMENT, dtype=np.int64)  # each query's k best keys
    ordered = np.ones(n_queries, dtype=np.bool_)  # whether they are in ascending order
    bars = np.full(n_queries, NO_DOCUMENT, dtype=np.int64)  # the k-th best of top
    slack = np.asarray(slack, dtype=np.int64)
    counts = np.zeros(n_queries, dtype=np.int64)
    entered = np.zeros(n_queries, dtype=np.int64)  # the buffer's candidates up to here have entered top
    overflow = np.zeros(n_queries, dtype=np.bool_)
    summed = PrefixSums(codes, *prefix_sums)
    by_sums = np.argsort(source)[n_queries - summed.rows:]  # the query of each row scored by prefix sums
    kernel = _runnable(_push_integer_slab)[0]
    for d0, parts in slabs:
        width = parts.shape[1]
        # the documents of each summed row that reach its floor now (a superset of those the push takes)
        hits = summed.hits(np.where(overflow[by_sums], 2 ** 62, (bars[by_sums] >> 32) - slack[by_sums]), d0, width)
        resume = np.zeros(n_queries, dtype=np.int64)
        while True:
            with _running():
                kernel(parts, *hits, source, base, d0, top, ordered, k // FEW_ENTER, bars, slack, pool, start,
                       room, counts, entered, overflow, resume)
            full = np.flatnonzero(resume >= 0)
            if not len(full):
                break
            for q in full:  # a region twice as large at the end of the pool, or the query overflows
                if used + 2 * room[q] > MAX_CANDIDATES:
                    overflow[q] = True
                    continue
                if used + 2 * room[q] > len(pool):
                    size = min(MAX_CANDIDATES, max(2 * len(pool), used + 2 * room[q]))
                    pool = np.concatenate([pool[:used], np.empty(size - used, dtype=np.int64)])
                pool[used:used + counts[q]] = pool[start[q]:start[q] + counts[q]]
                start[q], room[q], used = used, 2 * room[q], used + 2 * room[q]
            resume[resume < 0] = width  # the others are done with this slab
    best, candidates, none = [], [], np.empty(0, dtype=np.int64)
    for q in range(n_queries):
        if overflow[q]:
            best.append(none)
            candidates.append((none, none))
            continue
        best.append(ID_MAX - (top[q][top[q] != NO_DOCUMENT] & ID_MAX))
        keys = pool[start[q]:start[q] + counts[q]]
        near = keys[keys >> 32 >= (bars[q] >> 32) - slack[q]]
        candidates.append((ID_MAX - (near & ID_MAX), near >> 32))
    return best, candidates, overflow


def exact_scores(rows: np.ndarray, dims: np.ndarray, values: np.ndarray, starts: np.ndarray, docids) -> list:
    """Each query's float64 scores of its ``docids`` (query ``q``'s kept ``dims`` and ``values`` at ``starts[q]:
    starts[q + 1]``): ``sum_j values_j rows[docid, dims_j]``, in order (``rows`` may be a transposed view)."""
    if not len(docids):
        return []
    sizes = np.array([len(ids) for ids in docids], dtype=np.int64)
    flat = np.concatenate(docids).astype(np.int64)
    out = np.empty(len(flat))
    kernel = _runnable(_exact_scores)[0]
    by_document = np.argsort(flat)  # a document's row read once for every query that scores it, in file order
    with _running():
        kernel(rows, dims, values.astype(np.float64), starts, flat, np.repeat(np.arange(len(docids)), sizes),
               by_document, out)
    return np.split(out, np.cumsum(sizes)[:-1])


#: Documents per block of the prefix sums, at most (fewer where the threads would otherwise idle): long runs of each
#: row amortise its setup; on a Zen 3, 473 rows of 43 trees scored 1.6x faster than in blocks of 512 (fitting L2).
NESTED_BLOCK_DOCS = 4096


class PrefixSums:
    """Rows scored by prefix sums a block of documents at a time, in the cache: each row its parent's int32 scores
    (``parents[r]``, -1: none; parents first) plus its own ``dims`` times ``weights`` (``starts[r]:starts[r + 1]``);
    only the documents that reach a row's floor leave the cache (:meth:`hits`)."""

    def __init__(self, codes: np.ndarray, dims: np.ndarray, weights: np.ndarray, starts: np.ndarray,
                 parents: np.ndarray):
        if codes.strides[1] != 1 or (len(weights) and np.abs(weights).max() > 2 ** 15 - 1):
            raise ValueError('prefix sums multiply contiguous rows of codes by weights within an int16')
        self.codes, self.dims, self.weights, self.starts, self.parents = codes, dims, weights, starts, parents
        self.rows = len(parents)
        self.slots, self.n_slots = scratch_slots(parents)
        self._docs = self._scores = np.empty((self.rows, 0), dtype=np.int32)  # re-used slab after slab

    def hits(self, floors: np.ndarray, d0: int, width: int):
        """``(docs, scores, counts, block)`` of documents ``d0:d0 + width``: row ``r``'s documents whose score reaches
        ``floors[r]`` are, in block ``b``, ``docs[r, b * block:b * block + counts[r, b]]`` (offsets in the slab,
        ascending), their scores at the same places of ``scores``."""
        kernel, threads = _runnable(_nested_hits)
        block = max(1, min(NESTED_BLOCK_DOCS, -(-width // threads)))
        if self._docs.shape[1] < width:
            self._docs, self._scores = (np.empty((self.rows, width), dtype=np.int32) for _ in range(2))
        counts = np.zeros((self.rows, -(-width // block)), dtype=np.int64)
        if self.rows:
            with _running():
                kernel(self.codes, self.dims, self.weights, self.starts, self.parents, self.slots, self.n_slots,
                       np.asarray(floors, dtype=np.int64), d0, width, block, self._docs, self._scores, counts)
        return self._docs, self._scores, counts, block


def scratch_slots(parents: np.ndarray):
    """``(slots, n)``: the scratch row of each row's scores in a block. A parent's last child takes its parent's (its
    dims add in place: a chain of rows needs one); another row one that no later row still reads."""
    last_child = np.full(len(parents), -1)
    for r, p in enumerate(parents):
        if p >= 0:
            last_child[p] = r
    slots, free, n = np.empty(len(parents), dtype=np.int64), [], 0
    for r, p in enumerate(parents):
        if p >= 0 and last_child[p] == r:
            slots[r] = slots[p]
        elif free:
            slots[r] = free.pop()
        else:
            slots[r], n = n, n + 1
        if last_child[r] < 0:  # no child reads it: free once its hits are out
            free.append(slots[r])
    return slots, n


_jit = numba.njit(cache=True, nogil=True, fastmath={'contract'})
_parallel_jit = numba.njit(parallel=True, cache=True, nogil=True, fastmath={'contract'})
_prange = numba.prange


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
    # acc[:n] += weights[r] * matrix[dims[r], b0:b0 + n] for r in [j, stop), eight rows per pass over acc; the
    # remaining 0-7 rows in at most two passes (in a batch's tile they are most of the work)
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
    if j + 3 <= stop:
        r0, r1, r2 = matrix[dims[j], b0:b0 + n], matrix[dims[j + 1], b0:b0 + n], matrix[dims[j + 2], b0:b0 + n]
        w0, w1, w2 = weights[j], weights[j + 1], weights[j + 2]
        for t in range(n):
            acc[t] += w0 * r0[t] + w1 * r1[t] + w2 * r2[t]
    elif j + 2 <= stop:
        r0, r1 = matrix[dims[j], b0:b0 + n], matrix[dims[j + 1], b0:b0 + n]
        w0, w1 = weights[j], weights[j + 1]
        for t in range(n):
            acc[t] += w0 * r0[t] + w1 * r1[t]
    elif j < stop:
        r0, w0 = matrix[dims[j], b0:b0 + n], weights[j]
        for t in range(n):
            acc[t] += w0 * r0[t]


#: The pair products' order within 16 documents (AVX2's unpacking works within each half of a 256-bit register).
_LOW_HALF = [0, 16, 1, 17, 2, 18, 3, 19, 8, 24, 9, 25, 10, 26, 11, 27]
_HIGH_HALF = [4, 20, 5, 21, 6, 22, 7, 23, 12, 28, 13, 29, 14, 30, 15, 31]


def _pair_products(pairs: int):
    """A numba intrinsic adding ``pairs`` pairs of code rows, times their weights, to 16 int32 scores at once: each
    pair's codes (int8, widened to int16) interleaved document by document and multiplied by the pair's two weights
    (int16) as one product of 16-bit pairs summed into 32 bits. Plain LLVM vector code, which LLVM lowers to
    ``vpmaddwd`` on AVX2 (twice the multiply-adds per instruction of ``vpmulld``, numba's choice for the same sum
    written element by element) and to plain vector arithmetic elsewhere. The 16 scores come out in the order
    :func:`_position` undoes: documents 0-3, 8-11, then 4-7, 12-15. Reads 16 codes of each row from ``t`` on: the
    caller keeps ``t + 16`` within the rows and the scores."""
    i8, i16, i32, i64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
    codes16, wide, scores8 = ir.VectorType(i16, 16), ir.VectorType(i32, 16), ir.VectorType(i32, 8)

    def multiply_pairs(builder, x, w):  # x[2i] w[2i] + x[2i + 1] w[2i + 1], exact in int32
        product = builder.mul(builder.sext(x, wide), builder.sext(w, wide))
        even, odd = (builder.shuffle_vector(product, ir.Constant(wide, ir.Undefined),
                                            ir.Constant(scores8, list(range(start, 16, 2)))) for start in (0, 1))
        return builder.add(even, odd)

    @intrinsic
    def add_pairs(typingctx, scores_address, row_addresses, offset, packed_weights):
        def codegen(context, builder, signature, args):
            scores, rows, t, weights = args
            low_at = builder.inttoptr(builder.add(scores, builder.mul(t, ir.Constant(i64, 4))),
                                      ir.PointerType(scores8))
            high_at = builder.gep(low_at, [ir.Constant(i64, 1)])
            low, high = builder.load(low_at, align=4), builder.load(high_at, align=4)
            for p in range(pairs):
                a, b = (builder.sext(builder.load(builder.inttoptr(
                    builder.add(builder.extract_value(rows, i), t), ir.PointerType(ir.VectorType(i8, 16))), align=1),
                    codes16) for i in (2 * p, 2 * p + 1))
                w = builder.insert_element(ir.Constant(scores8, ir.Undefined), builder.extract_value(weights, p),
                                           ir.Constant(i32, 0))
                w = builder.bitcast(builder.shuffle_vector(w, ir.Constant(scores8, ir.Undefined),
                                                           ir.Constant(scores8, [0] * 8)), codes16)
                low = builder.add(low, multiply_pairs(builder, builder.shuffle_vector(
                    a, b, ir.Constant(wide, _LOW_HALF)), w))
                high = builder.add(high, multiply_pairs(builder, builder.shuffle_vector(
                    a, b, ir.Constant(wide, _HIGH_HALF)), w))
            builder.store(low, low_at, align=4)
            builder.store(high, high_at, align=4)
            return context.get_dummy_value()

        return types.void(scores_address, row_addresses, offset, packed_weights), codegen

    return add_pairs


_add_four_pairs, _add_one_pair = _pair_products(4), _pair_products(1)


@_jit
def _packed(w0, w1):
    # two int16 weights in one int32, w0 in the low half (the first of each pair of codes)
    return np.int32((np.int64(w0) & 0xFFFF) | ((np.int64(w1) & 0xFFFF) << 16))


@_jit
def _position(t, grouped):
    # where _add_code_rows keeps document t's score (documents from `grouped` on stay in place); its own inverse
    return (t & ~12) | ((t & 4) << 1) | ((t & 8) >> 1) if t < grouped else t


@_jit
def _add_code_rows(acc, codes, dims, weights, j, stop, b0, n):
    # acc += weights[r] * codes[dims[r], b0:b0 + n] for r in [j, stop): int8 codes, int16 weights; eight rows per pass
    # over acc, then pairs (an odd row paired with itself, weight 0). acc's first n // 16 * 16 documents are kept in
    # groups of 16 in _pair_products' order (see _position), the rest in place
    grouped = n // 16 * 16
    address, base, stride = acc.ctypes.data, codes.ctypes.data + b0, codes.strides[0]
    while j < stop:
        if j + 8 <= stop:
            rows = (base + dims[j] * stride, base + dims[j + 1] * stride, base + dims[j + 2] * stride,
                    base + dims[j + 3] * stride, base + dims[j + 4] * stride, base + dims[j + 5] * stride,
                    base + dims[j + 6] * stride, base + dims[j + 7] * stride)
            packed = (_packed(weights[j], weights[j + 1]), _packed(weights[j + 2], weights[j + 3]),
                      _packed(weights[j + 4], weights[j + 5]), _packed(weights[j + 6], weights[j + 7]))
            for t in range(0, grouped, 16):
                _add_four_pairs(address, rows, t, packed)
            width = 8
        else:
            second, w = (j + 1, weights[j + 1]) if j + 1 < stop else (j, 0)
            pair = (base + dims[j] * stride, base + dims[second] * stride)
            packed1 = (_packed(weights[j], w),)
            for t in range(0, grouped, 16):
                _add_one_pair(address, pair, t, packed1)
            width = 2 if j + 1 < stop else 1
        for t in range(grouped, n):
            s = acc[t]
            for i in range(j, j + width):
                s += weights[i] * codes[dims[i], b0 + t]
            acc[t] = s
        j += width


@_parallel_jit
def _fused_kernel(matrix, dims, weights, starts, k, block, tile, chunks, approx):
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
            if approx.shape[0]:
                approx[b0:b0 + n] = acc[0, :n]
            for q in range(n_queries):
                _push_block(heap_s[c, q], heap_i[c, q], acc[q], n, b0)
    return heap_s, heap_i


@_jit
def _reaching(high, low, base, t0, floor, found, found_scores):
    # writes the documents t0: whose score reaches floor and their scores to found, returns how many: a scan with no
    # other work, at the speed of memory, before the few candidates are handled one by one
    n = 0
    for t in range(t0, high.shape[0]):
        s = base * np.int64(high[t]) + low[t]
        if s >= floor:
            found[n] = t
            found_scores[n] = s
            n += 1
    return n


@_jit
def _listed(docs, scores, counts, block, t0, found, found_scores):
    # the same from the hits of a row scored by prefix sums (a superset), block after block
    n = 0
    for b in range(counts.shape[0]):
        for i in range(b * block, b * block + counts[b]):
            if docs[i] >= t0:
                found[n] = docs[i]
                found_scores[n] = scores[i]
                n += 1
    return n


@_jit
def _enter(top, pool, lo, hi, bar, ordered, few):
    # the keys of pool[lo:hi] above bar enter top (its k best keep their places); returns the new k-th best and whether
    # top is now in ascending order. Many keys: one selection in a few sequential passes (top left unordered); few:
    # each by a binary search and a shift of the ordered top (ordered once first), where a selection reads all k
    m = 0
    for j in range(lo, hi):
        m += pool[j] > bar
    if m == 0:
        return bar, ordered
    k = top.shape[0]
    if m > few:
        merged = np.empty(k + m, dtype=np.int64)
        merged[:k] = top
        m = k
        for j in range(lo, hi):
            if pool[j] > bar:
                merged[m] = pool[j]
                m += 1
        merged = np.partition(merged, m - k)
        top[:] = merged[m - k:]
        return merged[m - k], False
    if not ordered:
        top.sort()
    for j in range(lo, hi):
        key = pool[j]
        if key > top[0]:  # keys are distinct (their docids) but for NO_DOCUMENT
            at = np.searchsorted(top, key) - 1  # top[at] < key, the lowest drops out
            for i in range(at):
                top[i] = top[i + 1]
            top[at] = key
    return top[0], True


@_parallel_jit
def _push_integer_slab(parts, hit_docs, hit_scores, hit_counts, block, source, base, d0, top, ordered, few, bars,
                       slack, pool, start, room, counts, entered, overflow, resume):
    # each query pushes the slab's documents from resume[q] on; resume[q] becomes -1 when done, or the document
    # its full buffer stopped at; its candidates enter its top-k when the buffer is compacted and after each slab
    n_queries, n_parts, width = top.shape[0], parts.shape[0] // 2, parts.shape[1]
    for q in _prange(n_queries):
        stop = -1
        if not overflow[q]:
            row = source[q]  # of the int8 product's ``base * high + low`` rows, then of the prefix sums
            first, capacity, c, margin, bar = start[q], room[q], counts[q], slack[q], bars[q]
            floor = (bar >> 32) - margin
            if row >= n_parts:
                r = row - n_parts
                found, found_scores = np.empty(hit_counts[r].sum(), np.int32), np.empty(hit_counts[r].sum(), np.int64)
                n_found = _listed(hit_docs[r], hit_scores[r], hit_counts[r], block, resume[q], found, found_scores)
            else:
                found, found_scores = np.empty(width, dtype=np.int32), np.empty(width, dtype=np.int64)
                n_found = _reaching(parts[row], parts[n_parts + row], base, resume[q], floor, found, found_scores)
            for f in range(n_found):
                t, s = found[f], found_scores[f]
                if s < floor:
                    continue
                if c == capacity:  # the k-th best rises, then drop what it has left behind, in order
                    bar, ordered[q] = _enter(top[q], pool, first + entered[q], first + c, bar, ordered[q], few)
                    floor = (bar >> 32) - margin
                    kept = 0
                    for j in range(first, first + c):
                        if pool[j] >> 32 >= floor:
                            pool[first + kept] = pool[j]
                            kept += 1
                    c = kept
                    entered[q] = kept
                    if c == capacity:
                        stop = t
                        break
                    if s < floor:
                        continue
                pool[first + c] = (s << 32) + (ID_MAX - (d0 + t))
                c += 1
            if stop < 0:
                bar, ordered[q] = _enter(top[q], pool, first + entered[q], first + c, bar, ordered[q], few)
                entered[q] = c
            counts[q] = c
            bars[q] = bar
        resume[q] = stop


# no fastmath: each product rounded, then summed in order (as numpy sums them), never fused into one multiply-add
@numba.njit(parallel=True, cache=True, nogil=True)
def _exact_scores(rows, dims, values, starts, docids, owner, order, out):
    for o in _prange(len(docids)):
        i = order[o]
        q, d, s = owner[i], docids[i], 0.0
        for j in range(starts[q], starts[q + 1]):
            s += np.float64(rows[d, dims[j]]) * values[j]
        out[i] = s


@_parallel_jit
def _nested_hits(codes, dims, weights, starts, parents, slots, n_slots, floors, d0, width, block, docs, scores,
                 counts):
    # parallel over blocks of documents: each row's scores built in a scratch row in the cache (its parent's copied,
    # or added to in place; in the order of _add_code_rows), then only the documents reaching its floor written out;
    # exact: the sums fit an int32
    for b in _prange(counts.shape[1]):
        lo = b * block
        n = min(width, lo + block) - lo
        grouped = n // 16 * 16
        scratch = np.empty((max(n_slots, 1), block), dtype=np.int32)
        for r in range(parents.shape[0]):
            acc = scratch[slots[r], :n]
            if parents[r] < 0:
                acc[:] = 0
            elif slots[parents[r]] != slots[r]:
                acc[:] = scratch[slots[parents[r]], :n]
            _add_code_rows(acc, codes, dims, weights, starts[r], starts[r + 1], d0 + lo, n)
            if floors[r] > 2 ** 31 - 1:  # above every int32 score
                continue
            cut = np.int32(max(floors[r], -2 ** 31))
            c = 0
            for t0 in range(0, n, 64):  # a vectorised maximum first: few documents reach the floor
                t1 = min(n, t0 + 64)
                top = acc[t0]
                for t in range(t0 + 1, t1):
                    top = max(top, acc[t])
                if top < cut:
                    continue
                for t in range(t0, t1):  # in document order, without branches: each written, kept where it reaches
                    s = acc[_position(t, grouped)]
                    docs[r, lo + c] = lo + t
                    scores[r, lo + c] = s
                    c += s >= cut
            counts[r, b] = c


_SERIAL = {}


def _runnable(kernel):
    """``(kernel, threads)``: the parallel kernel, or its serial twin in a child forked after GNU OpenMP ran."""
    if _FORKED['forked']:
        return _serial(kernel), 1
    return kernel, numba.get_num_threads()


@contextlib.contextmanager
def _running():
    """Around every parallel kernel call: one at a time, noting the threading layer after the first."""
    with _KERNEL_LOCK:
        yield
        if _PARALLEL['layer'] is None and not _FORKED['forked']:
            _PARALLEL['layer'] = numba.threading_layer()


def _serial(kernel):
    """The kernel compiled without the parallel loop (not cached on disk: it would share the parallel entry)."""
    if kernel not in _SERIAL:
        _SERIAL[kernel] = numba.njit(nogil=True, fastmath=kernel.targetoptions.get('fastmath', False))(kernel.py_func)
    return _SERIAL[kernel]
