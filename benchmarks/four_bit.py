#!/usr/bin/env python
"""Would a 4-bit first pass make the compressed path faster? A measurement before any library code.

The compressed path (``strategy='compressed'``) scans the kept rows of the int8 copy at close to the memory
bandwidth, so only fewer bits per kept value can make its first pass faster. This prototype packs two kept values
per byte (dimension-major; one scale per dimension, codes in ``[-7, 7]``, the measured largest error per dimension)
and times, for one RDIME-pruned query at a time over the synthetic index of ``search`` (default 1M x 768, top-100):

1. the 4-bit scan of the kept rows (approximate scores of every document and their ``k`` best);
2. the lower bound of the k-th best exact score (the 4-bit ``k`` best re-scored exactly) and the candidates whose
   upper bound (approximate score + the bound of ``compressed.error_bound``, built the same way for 4 bits)
   reaches it;
3. the int8 re-check of the candidates (their int8 scores gathered from the int8 copy's kept rows; the tighter
   bound) and 4. the exact re-score of the survivors, or the exact re-score of every candidate at once;

against today's int8 path (``compressed.search_compressed``) and the dense path, side by side in each round. For a
batch it times one int8 matrix product per slab of the unpacked 4-bit codes with one-part int8 weights (half the
products of the int8 one pass, which needs two parts), then the same candidates, against the int8 one pass and the
dense path. Every top-100 is checked against the dense path.

The 4-bit copy is built once from the float32 layout and cached beside the synthetic index's benchmark cache.

Measured (pyterrier_rdime/pt_docs/speed.rst, "A 4-bit first pass: measured, not kept"): the 4-bit scan is faster than
the int8 scan, but its exact bound is ~18x looser, so ~9 % of the documents stay candidates; in a dimension-major copy
their re-check reads nearly every cache line of the kept rows again, and the path loses to the int8 one. No library
code was built from it.

Usage (from the repository root)::

    python benchmarks/run.py four_bit                 # 1M x 768, ~5 min once the caches exist
    python benchmarks/run.py four_bit --docs 200000   # a quick check
"""
import argparse
import json
import math
import sys
import time

import common  # first: it sets the environment (offline hub, temporary PyTerrier homes)
import numba
import numpy as np
from common import log, table, timed

from pyterrier_rdime import PrunedRetriever
from pyterrier_rdime.pruned import _numba, compressed, dense, kept
from pyterrier_rdime.pruned.plan import kept_dims
from pyterrier_rdime.pruned.topk import merge_heaps

K = 100
#: The 4-bit codes are in ``[-CODE_MAX4, CODE_MAX4]``.
CODE_MAX4 = 7
#: Documents per packed block: in a block of ``n`` documents, byte ``i`` holds document ``i`` (low nibble) and
#: document ``half + i`` (high nibble), ``half = ceil(n / 2)``, so that the scan adds to two contiguous halves of the
#: block's scores. Also the block of the scan and the slab of the batch.
PACK_DOCS = 16384


# --- the 4-bit copy -----------------------------------------------------------------------------------------------

def quantise4(rows: np.ndarray):
    """``(codes, scale, error)`` of float32 rows ``(n, docs)``: codes int8 in ``[-7, 7]``, as the int8 copy."""
    rows = np.asarray(rows, dtype=np.float32)
    scale = (np.abs(rows).max(axis=1, initial=0) / CODE_MAX4).astype(np.float32)
    scale[scale == 0] = 1
    codes = np.clip(np.rint(rows / scale[:, None]), -CODE_MAX4, CODE_MAX4).astype(np.int8)
    error = np.abs(rows.astype(np.float64) - scale.astype(np.float64)[:, None] * codes).max(axis=1, initial=0)
    return codes, scale, error


def pack(codes: np.ndarray) -> np.ndarray:
    """Pack int8 codes ``(n, docs)`` in ``[-8, 7]`` two per byte as ``code + 8`` (in ``[0, 15]``), block by block
    (:data:`PACK_DOCS`)."""
    n, docs = codes.shape
    out = np.zeros((n, (docs + 1) // 2), dtype=np.uint8)
    for b0 in range(0, docs, PACK_DOCS):
        m = min(docs, b0 + PACK_DOCS) - b0
        half = (m + 1) // 2
        lo = (codes[:, b0:b0 + half] + 8).astype(np.uint8)
        hi = np.full_like(lo, 8)
        hi[:, :m - half] = codes[:, b0 + half:b0 + m] + 8
        out[:, b0 // 2:b0 // 2 + half] = lo | (hi << 4)
    return out


def unpack(packed: np.ndarray, docs: int) -> np.ndarray:
    """The int8 codes of :func:`pack` (for checks)."""
    out = np.empty((packed.shape[0], docs), dtype=np.int8)
    for b0 in range(0, docs, PACK_DOCS):
        m = min(docs, b0 + PACK_DOCS) - b0
        half = (m + 1) // 2
        block = packed[:, b0 // 2:b0 // 2 + half].astype(np.int16)
        out[:, b0:b0 + half] = (block & 15) - 8
        out[:, b0 + half:b0 + m] = ((block >> 4) - 8)[:, :m - half]
    return out


def four_bit_copy(matrix: np.ndarray, cache):
    """``(packed, scale, error)`` of the float32 dimension-major ``matrix``, cached under ``cache``."""
    dims, docs = matrix.shape
    path = cache / f'four-bit-{docs}x{dims}.u4.npy'
    meta = path.with_suffix('.json')
    if path.is_file() and meta.is_file():
        record = json.loads(meta.read_text())
        return np.load(path, mmap_mode='r'), np.asarray(record['scale'], np.float32), np.asarray(record['error'])
    packed = np.empty((dims, (docs + 1) // 2), dtype=np.uint8)
    scale, error = np.empty(dims, np.float32), np.empty(dims)
    for j in range(0, dims, 8):
        codes, scale[j:j + 8], error[j:j + 8] = quantise4(matrix[j:j + 8])
        packed[j:j + 8] = pack(codes)
    np.save(path, packed)
    meta.write_text(json.dumps({'scale': scale.tolist(), 'error': error.tolist()}))
    return np.load(path, mmap_mode='r'), scale, error


def bound4(scale, error, dims, values, weights, code_max=CODE_MAX4, summed_max=2 * CODE_MAX4 + 1) -> float:
    """:func:`compressed.error_bound` for codes in ``[-code_max, code_max]`` summed as ``code + 8`` (at most
    ``summed_max``; the caller subtracts ``8 sum_j weights_j`` in float64)."""
    values64, weights64 = values.astype(np.float64), weights.astype(np.float64)
    quantisation = float(np.abs(values64) @ error[dims])
    weight_rounding = float(np.abs(values64 * scale[dims].astype(np.float64) - weights64).sum()) * code_max
    m = (len(dims) + 2) * compressed.UNIT_ROUNDOFF
    sum_rounding = m / (1 - m) * float(np.abs(weights64).sum()) * summed_max
    return (quantisation + weight_rounding + sum_rounding) * (1 + 1e-9)


# --- compiled kernels ---------------------------------------------------------------------------------------------

_pjit = numba.njit(parallel=True, cache=True, nogil=True, fastmath={'contract'})
_jit = numba.njit(cache=True, nogil=True, fastmath={'contract'})


@_jit
def _add_rows4(acc, packed, dims, weights, p0, half):
    # acc[:half] += weights[r] * low nibbles, acc[half:2 half] += weights[r] * high nibbles of the rows' bytes from
    # p0, eight rows per pass; the nibbles (code + 8, in [0, 15]) decoded in float32 (byte = 16 high + low, exact),
    # sixteen lanes wide: the caller subtracts 8 sum_r weights[r]
    j, stop = 0, dims.shape[0]
    sixteenth, sixteen = np.float32(0.0625), np.float32(16)
    while j + 8 <= stop:
        r0, r1 = packed[dims[j], p0:p0 + half], packed[dims[j + 1], p0:p0 + half]
        r2, r3 = packed[dims[j + 2], p0:p0 + half], packed[dims[j + 3], p0:p0 + half]
        r4, r5 = packed[dims[j + 4], p0:p0 + half], packed[dims[j + 5], p0:p0 + half]
        r6, r7 = packed[dims[j + 6], p0:p0 + half], packed[dims[j + 7], p0:p0 + half]
        w0, w1, w2, w3 = weights[j], weights[j + 1], weights[j + 2], weights[j + 3]
        w4, w5, w6, w7 = weights[j + 4], weights[j + 5], weights[j + 6], weights[j + 7]
        for t in range(half):
            f0, f1, f2, f3 = np.float32(r0[t]), np.float32(r1[t]), np.float32(r2[t]), np.float32(r3[t])
            f4, f5, f6, f7 = np.float32(r4[t]), np.float32(r5[t]), np.float32(r6[t]), np.float32(r7[t])
            h0, h1, h2, h3 = (np.floor(f0 * sixteenth), np.floor(f1 * sixteenth), np.floor(f2 * sixteenth),
                              np.floor(f3 * sixteenth))
            h4, h5, h6, h7 = (np.floor(f4 * sixteenth), np.floor(f5 * sixteenth), np.floor(f6 * sixteenth),
                              np.floor(f7 * sixteenth))
            acc[t] += (w0 * (f0 - sixteen * h0) + w1 * (f1 - sixteen * h1) + w2 * (f2 - sixteen * h2)
                       + w3 * (f3 - sixteen * h3) + w4 * (f4 - sixteen * h4) + w5 * (f5 - sixteen * h5)
                       + w6 * (f6 - sixteen * h6) + w7 * (f7 - sixteen * h7))
            acc[half + t] += w0 * h0 + w1 * h1 + w2 * h2 + w3 * h3 + w4 * h4 + w5 * h5 + w6 * h6 + w7 * h7
        j += 8
    while j < stop:
        r0, w0 = packed[dims[j], p0:p0 + half], weights[j]
        for t in range(half):
            f0 = np.float32(r0[t])
            h0 = np.floor(f0 * sixteenth)
            acc[t] += w0 * (f0 - sixteen * h0)
            acc[half + t] += w0 * h0
        j += 1


@_pjit
def _scan4_kernel(packed, dims, weights, k, block, chunks, approx):
    n_docs = approx.shape[0]
    heap_s = np.full((chunks, 1, k), -np.inf, dtype=np.float32)
    heap_i = np.full((chunks, 1, k), -1, dtype=np.int64)
    per_chunk = (n_docs + chunks - 1) // chunks
    per_chunk = (per_chunk + block - 1) // block * block
    for c in numba.prange(chunks):
        acc = np.empty(block, dtype=np.float32)
        lo = c * per_chunk
        hi = min(n_docs, lo + per_chunk)
        for b0 in range(lo, hi, block):
            n = min(hi, b0 + block) - b0
            half = (n + 1) // 2
            acc[:2 * half] = 0.0
            _add_rows4(acc, packed, dims, weights, b0 // 2, half)
            # the block's scores in docid order (the low halves, then the high halves), pushed while in the cache
            approx[b0:b0 + half] = acc[:half]
            approx[b0 + half:b0 + n] = acc[half:n]
            _numba._push_block(heap_s[c, 0], heap_i[c, 0], approx[b0:b0 + n], n, b0)
    return heap_s, heap_i


@_pjit
def _gather8_kernel(codes, dims, weights, cand, out):
    # the int8 first-pass score of each candidate (ascending docids), a row of the kept dims at a time
    n = cand.shape[0]
    chunk = 4096
    for c in numba.prange((n + chunk - 1) // chunk):
        lo = c * chunk
        hi = min(n, lo + chunk)
        acc = np.zeros(hi - lo, dtype=np.float32)
        for r in range(dims.shape[0]):
            row, w = codes[dims[r]], weights[r]
            for t in range(lo, hi):
                acc[t - lo] += w * np.float32(row[cand[t]])
        out[lo:hi] = acc


@_pjit
def _exact_kernel(doc_rows, dims, values, cand, out):
    # the float64 exact score of each candidate from its row, summed in dimension order
    for t in numba.prange(cand.shape[0]):
        row = doc_rows[cand[t]]
        s = 0.0
        for r in range(dims.shape[0]):
            s += np.float64(row[dims[r]]) * np.float64(values[r])
        out[t] = s


@_pjit
def _unpack_slab(packed, p0, half, n, out):
    for j in numba.prange(packed.shape[0]):
        row = packed[j]
        for t in range(half):
            b = np.int32(row[p0 + t])
            out[j, t] = (b & 15) - 8
            if half + t < n:
                out[j, half + t] = (b >> 4) - 8


@_pjit
def _push_slab(scores, d0, half, n, heap_s, heap_i, slack, buf_s, buf_i, counts, overflow):
    # the one-part variant of _numba._push_integer_slab; column t of the slab is document d0 + (t < half ? t : ...)
    # the slab is unpacked in docid order, so column t is document d0 + t
    n_queries = heap_s.shape[0]
    capacity = buf_s.shape[1]
    for q in numba.prange(n_queries):
        bar, c = heap_s[q, 0], counts[q]
        floor = bar - slack[q]
        for t in range(n):
            s = np.int64(scores[q, t])
            if s < floor:
                continue
            if not overflow[q]:
                if c == capacity:
                    kept_ = 0
                    for j in range(c):
                        if buf_s[q, j] >= floor:
                            buf_s[q, kept_] = buf_s[q, j]
                            buf_i[q, kept_] = buf_i[q, j]
                            kept_ += 1
                    c = kept_
                if c == capacity:
                    overflow[q] = True
                else:
                    buf_s[q, c] = s
                    buf_i[q, c] = d0 + t
                    c += 1
            if s > bar:
                _numba._replace_root(heap_s[q], heap_i[q], s, d0 + t)
                bar = heap_s[q, 0]
                floor = bar - slack[q]
        counts[q] = c


# --- one query ----------------------------------------------------------------------------------------------------

class FourBit:
    """The prototype: the 4-bit copy, the int8 copy and the document rows."""

    def __init__(self, packed, scale, error, codes8, doc_rows):
        self.packed, self.scale, self.error, self.codes8, self.doc_rows = packed, scale, error, codes8, doc_rows
        self.docs = doc_rows.shape[0]

    def scan(self, dims, weights, k):
        approx = np.empty(self.docs, dtype=np.float32)
        chunks = max(1, min(math.ceil(self.docs / PACK_DOCS), _numba.CHUNKS_PER_THREAD * numba.get_num_threads()))
        heap_s, heap_i = _scan4_kernel(self.packed, dims, weights, k, PACK_DOCS, chunks, approx)
        # approx holds sum_j weights_j (code_j + 8): the shift 8 sum_j weights_j (float64) is added to thresholds
        return approx, merge_heaps(heap_s, heap_i, k)[1][0], 8 * float(weights.astype(np.float64).sum())

    def exact(self, dims, values, ids):
        out = np.empty(len(ids))
        _exact_kernel(self.doc_rows, dims, values.astype(np.float64), ids, out)
        return out

    def search(self, query_vec, k, *, level8: bool, stages: dict = None):
        """Exact top-k of one query; ``stages`` (a dict) receives the time of each stage and the candidate counts."""
        t0 = time.perf_counter()
        dims, values, _ = kept_dims(query_vec[None])
        weights = (values * self.scale[dims]).astype(np.float32)
        approx, best, shift = self.scan(dims, weights, k)
        t1 = time.perf_counter()
        bound = bound4(self.scale, self.error, dims, values, weights)
        best = np.sort(best)
        best_scores = self.exact(dims, values, best)
        floor = best_scores.min()
        cand = np.flatnonzero(approx >= compressed.float32_below(floor - bound + shift))
        t2 = time.perf_counter()
        n1 = len(cand)
        if level8:
            c8 = self.codes8
            w8 = (values * c8.scale[dims]).astype(np.float32)
            a8 = np.empty(len(cand), dtype=np.float32)
            _gather8_kernel(c8.codes, dims, w8, cand, a8)
            b8 = compressed.error_bound(c8, dims, values, w8)
            if len(a8) >= k:  # the k-th best int8 score less its bound is below k exact scores
                floor = max(floor, float(np.partition(a8, len(a8) - k)[len(a8) - k]) - b8)
            cand = cand[a8 >= compressed.float32_below(floor - b8)]
        t3 = time.perf_counter()
        n2 = len(cand)
        others = cand[~np.isin(cand, best, assume_unique=True)]
        ids = np.concatenate([best, others])
        s = np.concatenate([best_scores, self.exact(dims, values, others)])
        order = compressed.best_k(s, ids, k)
        t4 = time.perf_counter()
        if stages is not None:
            for name, t in (('scan', t1 - t0), ('bound', t2 - t1), ('int8', t3 - t2), ('exact', t4 - t3)):
                stages.setdefault(name, []).append(t)
            stages.setdefault('n4', []).append(n1)
            stages.setdefault('n8', []).append(n2)
            stages.setdefault('bound4', []).append(bound)
        return s[order].astype(np.float32), ids[order]


def int8_stages(copy, doc_rows, query_vec, stages):
    """Today's int8 path, stage by stage (scan; k best re-scored, candidates, re-score)."""
    t0 = time.perf_counter()
    approx, best, bound = compressed.first_pass(copy, query_vec, K, use_numba=True)
    t1 = time.perf_counter()
    best = np.sort(best)
    best_scores = compressed.exact_scores(None, query_vec, best, doc_rows)
    cand = np.flatnonzero(approx >= compressed.float32_below(best_scores.min() - bound))
    compressed._rescored(None, query_vec, best, best_scores, cand, K, doc_rows)
    t2 = time.perf_counter()
    stages.setdefault('scan', []).append(t1 - t0)
    stages.setdefault('rest', []).append(t2 - t1)
    stages.setdefault('n', []).append(len(cand))
    stages.setdefault('bound', []).append(bound)


def ms(seconds) -> str:
    return f'{np.min(seconds) * 1000:.2f}'


def load() -> str:
    return ', '.join(f'{x:.1f}' for x in common.os.getloadavg())


def single(matrix, copy8, four, queries, args) -> dict:
    log(f'\n### One query at a time ({len(queries)} RDIME queries, {args.rounds} rounds, interleaved)\n')
    totals = {side: np.zeros(args.rounds) for side in ('dense', 'int8', '4-bit + exact', '4-bit + int8 + exact')}
    stage4, stage48, stage8 = {}, {}, {}
    status = {side: [] for side in totals}
    oracle = []
    for q in queries:
        one = q[None]
        fns = {'dense': lambda: dense.search_dense(matrix, one, K),
               'int8': lambda: compressed.search_compressed(copy8, matrix, one, K, use_numba=True,
                                                            doc_rows=four.doc_rows),
               '4-bit + exact': lambda: four.search(q, K, level8=False),
               '4-bit + int8 + exact': lambda: four.search(q, K, level8=True)}
        for fn in fns.values():
            fn()  # compile, warm
        times = common.interleaved(fns, args.rounds)
        for side in totals:
            totals[side] += times[side]
        per4, per48, per8 = {}, {}, {}
        for _ in range(args.rounds):
            four.search(q, K, level8=False, stages=per4)
            four.search(q, K, level8=True, stages=per48)
            int8_stages(copy8, four.doc_rows, q, per8)
        for into, per in ((stage4, per4), (stage48, per48), (stage8, per8)):
            for key, values in per.items():
                into.setdefault(key, []).append(np.min(values))
        ref = dense.search_dense(matrix, one, K)
        # the fewest candidates any threshold could give: the true k-th best score less the 4-bit bound
        d, v, _ = kept_dims(one)
        w = (v * four.scale[d]).astype(np.float32)
        approx, _, shift = four.scan(d, w, K)
        oracle.append(int(np.sum(approx >= ref[0][0][-1] - bound4(four.scale, four.error, d, v, w) + shift)))
        atol = 1e-5 * float(np.abs(q).sum())
        from search import check_topk
        for side, fn in fns.items():
            new = fn()
            new = (new[0][0], new[1][0]) if side in ('dense', 'int8') else new
            status[side].append(check_topk(matrix, q, (ref[0][0], ref[1][0]), new, atol))
    n = len(queries)
    best = {side: np.min(t) / n for side, t in totals.items()}
    rows = [[side, f'{best[side] * 1000:.2f} ms', f'{best["dense"] / best[side]:.2f}×',
             f'{best["int8"] / best[side]:.2f}×',
             '/'.join(str(status[side].count(s)) for s in ('identical', 'ties', 'MISMATCH'))] for side in totals]
    log(f'kept fraction {np.mean(queries != 0):.2f}; load average {load()}; time per query: sum over the queries of '
        'each round, least disturbed round\n')
    log(table(rows, ['path', 'time per query', 'vs dense', 'vs int8', 'top-100 id./ties/mism.']))
    mean = {name: {key: float(np.mean(v)) for key, v in d.items()}
            for name, d in (('4-bit + exact', stage4), ('4-bit + int8 + exact', stage48), ('int8', stage8))}
    log('\nStages (mean over the queries of the fastest of the rounds, ms); candidates: documents whose bound reaches '
        'the lower bound of the k-th best score after each level\n')
    rows = [['int8 (today)', ms([mean['int8']['scan']]), '', '', ms([mean['int8']['rest']]),
             f'{mean["int8"]["n"]:.0f}', '', f'{mean["int8"]["bound"]:.4f}']]
    for name in ('4-bit + exact', '4-bit + int8 + exact'):
        m = mean[name]
        rows.append([name, ms([m['scan']]), ms([m['bound']]), ms([m['int8']]), ms([m['exact']]), f'{m["n4"]:.0f}',
                     f'{m["n8"]:.0f}' if name.endswith('int8 + exact') else '', f'{m["bound4"]:.4f}'])
    log(table(rows, ['path', 'scan', 'k best exact + candidates', 'int8 re-check', 'exact re-score',
                     'candidates (first level)', 'after int8', 'bound of the first level']))
    log(f'\nWith the true k-th best score as the threshold (an oracle), the 4-bit bound would still leave '
        f'{np.mean(oracle):.0f} candidates per query ({np.mean(oracle) / four.docs:.1%} of the documents).')
    mean['oracle_candidates'] = float(np.mean(oracle))
    return {'per_query_s': best, 'stages': mean, 'check': {s: {c: v.count(c) for c in set(v)}
                                                           for s, v in status.items()}, 'load': load()}


# --- a batch in one pass ------------------------------------------------------------------------------------------

def batch4(four: FourBit, queries: np.ndarray, k: int, *, level8: bool, stages: dict = None):
    """The batch in one pass over the unpacked 4-bit codes: one int8 product per slab with one-part int8 weights."""
    import torch
    t0 = time.perf_counter()
    n_q, dims = queries.shape
    exact = queries.astype(np.float64) * four.scale.astype(np.float64)
    steps = np.abs(exact).max(axis=1, initial=0) / 127
    steps[steps == 0] = 1
    weights = np.rint(exact / steps[:, None]).astype(np.int64)
    bounds = np.empty(n_q)
    for i, q in enumerate(queries):
        d = np.flatnonzero(q)
        v = q[d].astype(np.float64)
        bounds[i] = (float(np.abs(v) @ four.error[d]) + float(np.abs(v * four.scale[d].astype(np.float64)
                                                                      - steps[i] * weights[i, d]).sum())
                     * CODE_MAX4) * (1 + 1e-9)
    slack = np.ceil(2 * bounds / steps).astype(np.int64) + 2
    # room for a quarter of the documents per query: the 4-bit bound leaves ~9 % of them (RDIME, 1M)
    capacity = max(_numba.CANDIDATES_PER_RESULT * k, four.docs // 4)
    heap_s = np.full((n_q, k), _numba.EMPTY_SCORE, dtype=np.int64)
    heap_i = np.full((n_q, k), -1, dtype=np.int64)
    buf_s = np.empty((n_q, capacity), dtype=np.int64)
    buf_i = np.empty((n_q, capacity), dtype=np.int64)
    counts = np.zeros(n_q, dtype=np.int64)
    overflow = np.zeros(n_q, dtype=np.bool_)
    w = torch.from_numpy(weights.astype(np.int8))
    slab = np.zeros((dims, PACK_DOCS), dtype=np.int8)
    slab_t = torch.from_numpy(slab)
    for b0 in range(0, four.docs, PACK_DOCS):
        n = min(four.docs, b0 + PACK_DOCS) - b0
        half = (n + 1) // 2
        _unpack_slab(four.packed, b0 // 2, half, n, slab)
        scores = torch._int_mm(w, slab_t).numpy()
        _push_slab(scores, b0, half, n, heap_s, heap_i, slack, buf_s, buf_i, counts, overflow)
    t1 = time.perf_counter()
    out_s, out_i, n4, n8 = [], [], [], []
    t_int8 = 0.0
    for i, q in enumerate(queries):
        if overflow[i]:  # candidates incomplete: the query on its own
            s, ids = four.search(q, k, level8=level8)
            out_s.append(s)
            out_i.append(ids)
            continue
        d = np.flatnonzero(q).astype(np.int64)
        v = q[d]
        best = np.sort(heap_i[i])
        best_scores = four.exact(d, v, best)
        floors = heap_s[i, 0] - slack[i]
        ids, sc = buf_i[i, :counts[i]], buf_s[i, :counts[i]]
        ids = ids[sc >= floors]
        sc = sc[sc >= floors]
        threshold = np.floor((best_scores.min() - bounds[i]) / steps[i]) - 1
        cand = np.sort(ids[sc >= threshold])
        n4.append(len(cand))
        if level8:
            ta = time.perf_counter()
            c8 = four.codes8
            w8 = (v * c8.scale[d]).astype(np.float32)
            a8 = np.empty(len(cand), dtype=np.float32)
            _gather8_kernel(c8.codes, d, w8, cand, a8)
            b8 = compressed.error_bound(c8, d, v, w8)
            floor = best_scores.min()
            if len(a8) >= k:
                floor = max(floor, float(np.partition(a8, len(a8) - k)[len(a8) - k]) - b8)
            cand = cand[a8 >= compressed.float32_below(floor - b8)]
            t_int8 += time.perf_counter() - ta
        n8.append(len(cand))
        others = cand[~np.isin(cand, best, assume_unique=True)]
        all_ids = np.concatenate([best, others])
        s = np.concatenate([best_scores, four.exact(d, v, others)])
        order = compressed.best_k(s, all_ids, k)
        out_s.append(s[order].astype(np.float32))
        out_i.append(all_ids[order])
    t2 = time.perf_counter()
    if stages is not None:
        stages.setdefault('one pass', []).append(t1 - t0)
        stages.setdefault('int8', []).append(t_int8)
        stages.setdefault('rest', []).append(t2 - t1 - t_int8)
        stages.setdefault('n4', []).append(float(np.mean(n4)) if n4 else float('nan'))
        stages.setdefault('n8', []).append(float(np.mean(n8)) if n8 else float('nan'))
        stages.setdefault('overflow', []).append(int(overflow.sum()))
    return out_s, out_i


def batch(matrix, copy8, four, queries, args) -> dict:
    log(f'\n### A batch of {len(queries)} in one pass ({args.rounds} rounds, interleaved)\n')
    fns = {'dense': lambda: dense.search_dense(matrix, queries, K, batch_size=len(queries)),
           'int8 one pass': lambda: compressed.search_compressed(copy8, matrix, queries, K, use_numba=True,
                                                                 one_pass=True, doc_rows=four.doc_rows),
           '4-bit one pass + exact': lambda: batch4(four, queries, K, level8=False),
           '4-bit one pass + int8 + exact': lambda: batch4(four, queries, K, level8=True)}
    for fn in fns.values():
        fn()
    times = common.interleaved(fns, args.rounds)
    st4, st48 = {}, {}
    for _ in range(2):
        batch4(four, queries, K, level8=False, stages=st4)
        batch4(four, queries, K, level8=True, stages=st48)
    ref = dense.search_dense(matrix, queries, K)
    from search import check_topk
    status = {}
    for side, fn in fns.items():
        new = fn()
        status[side] = [check_topk(matrix, q, (ref[0][i], ref[1][i]), (new[0][i], new[1][i]),
                                   1e-5 * float(np.abs(q).sum())) for i, q in enumerate(queries)]
    best = {side: float(np.min(t)) for side, t in times.items()}
    rows = [[side, f'{best[side] * 1000:.0f} ms', f'{best["dense"] / best[side]:.2f}×',
             f'{best["int8 one pass"] / best[side]:.2f}×',
             '/'.join(str(status[side].count(s)) for s in ('identical', 'ties', 'MISMATCH'))] for side in fns]
    log(f'load average {load()}\n')
    log(table(rows, ['path', 'time per batch', 'vs dense', 'vs int8 one pass', 'top-100 id./ties/mism.']))
    rows = [[name, ms(st['one pass']), ms(st['int8']), ms(st['rest']), f'{np.nanmean(st["n4"]):.0f}'
             if not np.isnan(st['n4']).all() else '— (every query overflowed)',
             f'{np.nanmean(st["n8"]):.0f}' if not np.isnan(st['n8']).all() else '—', f'{max(st["overflow"])}']
            for name, st in (('4-bit + exact', st4),
                                                                               ('4-bit + int8 + exact', st48))]
    log('\nStages (fastest of 2 runs, ms; candidates: mean per query)\n')
    log(table(rows, ['path', 'one pass (unpack + int8 product + candidates)', 'int8 re-check', 'k best exact, '
                     'exact re-score, top-k', 'candidates (4-bit)', 'after int8', 'queries overflowed']))
    return {'per_batch_s': best, 'load': load()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    common.synthetic_index_options(parser)
    parser.add_argument('--single', type=int, default=6, help='RDIME queries one at a time (0: none)')
    parser.add_argument('--batch', type=int, default=64, help='batch size (0: none)')
    parser.add_argument('--rounds', type=int, default=5)
    args = parser.parse_args(argv)
    from search import make_queries, pruned_query_sets
    with common.session(args, args.threads, f'## A 4-bit first pass: top-{K} over {args.docs:,} x {args.dims}\n') \
            as record:
        _, (index, state) = timed(lambda: common.synthetic_flex_index(args.cache, args.docs, args.dims))
        retriever = PrunedRetriever(index=index, num_results=K, strategy='compressed')
        matrix = retriever.dim_major()
        copy8 = retriever._compressed.codes()
        doc_rows = retriever._layout.doc_rows()
        build_s, (packed, scale, error) = timed(lambda: four_bit_copy(matrix, args.cache))
        log(f'4-bit copy: {packed.nbytes / 2 ** 20:.0f} MiB (int8 copy {copy8.codes.nbytes / 2 ** 20:.0f} MiB), '
            f'opened or built in {build_s:.1f} s; mean error / step: 4-bit {np.mean(error / scale):.3f}, int8 '
            f'{np.mean(copy8.error / copy8.scale):.3f}')
        four = FourBit(packed, scale, error, copy8, doc_rows)
        raw = make_queries(state, max(args.batch, args.single, 1))
        sets = pruned_query_sets(index, matrix, raw, ())
        kept.search_pruned(matrix, sets['RDIME'][:2], K)
        if args.single:
            record['results']['single'] = single(matrix, copy8, four, sets['RDIME'][:args.single], args)
        if args.batch:
            record['results']['batch'] = batch(matrix, copy8, four, sets['RDIME'][:args.batch], args)
    return 0


if __name__ == '__main__':
    sys.exit(main())
