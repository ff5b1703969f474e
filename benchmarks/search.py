#!/usr/bin/env python
"""How much faster is exact retrieval with pruned queries when only the kept dimensions are scored?

Exact top-100 over a seeded synthetic FlexIndex (default 1M x 768 float32, shaped like sentence embeddings, cached
on disk) through ``PrunedRetriever``'s on-disk dimension-major layout: the compiled pruned kernel against the dense
path (BLAS over every dimension with the zeroed query), with the same number of threads on both sides, measured in
blocks (each side several times in a row per round, the fastest kept: neither side pays for the other's spinning
threads) or, with ``--timing interleaved``, one call per side per round. Queries: PRF DIME (M = 2) from the exact
top-10, then RDIME or Top-k at 25/35/50/75 % kept.

0. the cost model of ``strategy='auto'`` for this machine (``--calibrate`` re-runs the calibration);
1. one query at a time: speed-up by kept fraction (min over rounds, median and IQR of the per-round ratios);
   1b. where the compressed path's speed comes from: the compressed path with the unpruned query (int8 alone) beside
   the float32 pruned path (pruning alone) and the compressed path with the pruned query (both), and the split of the
   speed-up over dense into int8 × pruning;
2. batches of 8 and 64 queries: the pruned and compressed paths against one dense matrix product per batch
   (the dense path, top-k included; the bare product without top-k is shown too), with the cost model's estimate of
   each path (whether ``strategy='auto'`` takes the fastest is ``run.py auto``'s question);
   2b. a batch shaped like the experiment's retrieve-mode cell (``--nested`` queries, each pruned 18 ways, most of
   them nested kept sets): the compressed one pass with every row by the int8 product against nested rows by prefix
   sums (``dense.nested_trees``), best of 3, results compared;
3. exactness: the pruned top-100 against the dense one, identical / differing only by float ties / mismatched;
4. the compressed path (``strategy='compressed'``) in the same rounds as 1. and 2., with the size and build
   time of its int8 copy;
5. the real DL19 pool vectors (MiniLM, 4.3k x 384; skipped without ../shared/data): exactness and auto's choice on a
   matrix that sits in the caches;
6. with ``--faiss``: what a user would pick instead, FAISS's exact ``IndexFlatIP`` and an IVF index with the full and
   the pruned query (latency, recall@100);
7. with ``--faiss``: the approximate alternatives, FAISS's 8-bit scalar quantiser with an exact re-ranking of the
   top k·r (``IndexRefineFlat``, r = 1, 2, 4) and HNSW (M = 32, efSearch 128-1024; its build is cached, see
   ``faiss_indexes.py``), with the full and the pruned query (latency, recall@100).

Usage (from the repository root)::

    python benchmarks/run.py search                      # 1M x 768, ~6 min (the first run: +1 min to write the index)
    python benchmarks/run.py search --docs 200000        # a quick check
    python benchmarks/run.py search --calibrate --json out.json
    python benchmarks/run.py search --threads 1 --timing interleaved
    python benchmarks/run.py search --single 0 --batches '' --collection none --int8-product float64   # ~2b alone
    python benchmarks/run.py search --docs 200000 --batches '' --faiss   # + FAISS (needs faiss-cpu)
    python benchmarks/faiss_indexes.py && python benchmarks/run.py search --single 6 --rounds 3 --batches '' --faiss
"""
import argparse
import dataclasses
import sys
import time
from pathlib import Path

import common  # first: it sets the environment (offline hub, temporary PyTerrier homes)
import numpy as np
import pandas as pd
from common import fmt_ratio, interleaved, log, ratio_stats, table, timed

from pyterrier_rdime import PrfDime, PrunedRetriever, Rdime, TopK
from pyterrier_rdime.pruned import calibration, compressed, dense, kept, layout, planner
from pyterrier_rdime.pruned.planner import Plan

K = 100
#: HNSW's search beam widths in ``--faiss`` (FAISS searches with at least ``K``: a smaller efSearch acts as ``K``).
HNSW_EF_SEARCH = (128, 256, 512, 1024)


def make_queries(state: dict, n: int, seed: int = 7) -> np.ndarray:
    """Queries from the corpus distribution: a topic centre plus noise, unit norm."""
    rng = np.random.default_rng(seed)
    centres, mean, scale = state['centres'], state['mean'], state['scale']
    noise = rng.standard_normal((n, len(mean))).astype(np.float32) * scale
    raw = mean + centres[rng.integers(0, len(centres), size=n)] + 0.9 * noise / np.linalg.norm(noise, axis=1,
                                                                                              keepdims=True)
    return (raw / np.linalg.norm(raw, axis=1, keepdims=True)).astype(np.float32)


def pruned_query_sets(index, matrix: np.ndarray, raw: np.ndarray, fractions) -> dict:
    """PRF DIME from the exact top-10 of each raw query, then each threshold: name -> (n, dims) pruned queries."""
    qframe = pd.DataFrame({'qid': [f'q{i}' for i in range(len(raw))], 'query': 'text', 'query_vec': list(raw)})
    feedback = (PrunedRetriever(index=index, num_results=10, strategy='dense') >> index.vec_loader())(qframe)
    scored = PrfDime(keep_ranking=False)(feedback)
    thresholds = {'RDIME': Rdime(), **{f'Top-k {f:.2f}': TopK(fraction=f) for f in fractions}}
    return {name: np.stack(threshold(scored)['query_vec']).astype(np.float32)
            for name, threshold in thresholds.items()}


def check_topk(matrix: np.ndarray, query_vec: np.ndarray, ref, new, atol: float) -> str:
    """'identical', 'ties' (the two top-k differ only among documents whose exact scores are within atol) or
    'MISMATCH'."""
    (ref_s, ref_i), (new_s, new_i) = ref, new
    if np.array_equal(ref_i, new_i) and np.allclose(ref_s, new_s, rtol=0, atol=atol):
        return 'identical'
    exact = query_vec.astype(np.float64) @ np.asarray(matrix[:, new_i], dtype=np.float64)
    ok = (len(new_i) == len(ref_i) and np.allclose(np.sort(new_s)[::-1], np.sort(ref_s)[::-1], rtol=0, atol=atol)
          and exact.min() >= ref_s.min() - atol and np.all(np.diff(exact) <= atol)
          and len(set(new_i.tolist())) == len(new_i))
    return 'ties' if ok else 'MISMATCH'


def plan_of(matrix: np.ndarray, queries: np.ndarray, strategy: str) -> Plan:
    """The plan the cost model decides for these queries under ``strategy`` (``'pruned'``, ``'compressed'``: query
    by query or in one pass; ``'auto'``: the model's prior, which ``PrunedRetriever`` then measures)."""
    return planner.choose(queries, strategy=strategy, matrix_bytes=matrix.nbytes, compiled=kept.NUMBA_AVAILABLE,
                          model=calibration.model, k=K).plan


@dataclasses.dataclass(frozen=True)
class Compressed:
    """What the compressed path reads: the int8 copy, and the document rows it re-scores from (the index's)."""
    codes: layout.Codes
    doc_rows: np.ndarray


def carry_out(matrix: np.ndarray, queries: np.ndarray, plan: Plan, copy: Compressed):
    """What ``PrunedRetriever.search`` does with this plan."""
    if plan.path == 'dense':
        return dense.search_dense(matrix, queries, K)
    if plan.strategy == 'compressed':
        return compressed.search_compressed(copy.codes, matrix, queries, K, use_numba=kept.NUMBA_AVAILABLE,
                                            one_pass=plan.path == 'compressed one pass', doc_rows=copy.doc_rows)
    return kept.search_pruned(matrix, queries, K, one_pass=plan.path == 'one pass')


def search_as(matrix: np.ndarray, queries: np.ndarray, strategy: str, copy: Compressed):
    """What ``PrunedRetriever(strategy=strategy)`` does for these queries: decide the plan, carry it out."""
    return carry_out(matrix, queries, plan_of(matrix, queries, strategy), copy)


def rescored(matrix: np.ndarray, copy: Compressed, query_vec: np.ndarray) -> int:
    """How many documents the compressed path re-scores exactly for this query (its k best first-pass documents and
    every other one its bound cannot rule out)."""
    approx, best, bound = compressed.first_pass(copy.codes, query_vec, K, use_numba=kept.NUMBA_AVAILABLE)
    threshold = compressed.exact_scores(matrix, query_vec[None], [np.sort(best)], copy.doc_rows,
                                         use_numba=kept.NUMBA_AVAILABLE)[0].min() - bound
    return int(np.sum(approx >= compressed.float32_below(threshold)))


def best_median(seconds) -> str:
    return f'{np.min(seconds) * 1000:.1f} / {np.median(seconds) * 1000:.1f} ms'


def load() -> str:
    return f'{common.os.getloadavg()[0]:.1f}'


def timing(args):
    """The timing scheme of ``--timing``: blocks (default) or interleaved rounds."""
    if args.timing == 'blocks':
        return lambda fns, rounds: common.blocks(fns, rounds, args.per_block)
    return interleaved


def estimates(matrix: np.ndarray, queries: np.ndarray) -> str:
    """The cost model's estimate of each path, in gemv units: ``'dense 9.8 · pruned 21 · one pass 6.5 · ...'``."""
    costs = calibration.model().path_costs(queries, k=K, matrix_bytes=matrix.nbytes, one_pass=len(queries) > 1)
    return ' · '.join(f'{path} {value:.2g}' for path, value in costs.items())


def single_queries(matrix: np.ndarray, copy: Compressed, sets: dict, raw: np.ndarray, args) -> dict:
    log(f'\n### 1. One query at a time ({args.single} queries per row, {args.rounds} rounds, timing: {args.timing})\n')
    measure = timing(args)
    rows, compressed_rows, result, checks = [], [], {}, {}
    for name, queries in sets.items():
        queries = queries[:args.single]
        totals = {side: np.zeros(args.rounds) for side in ('dense', 'pruned', 'compressed', 'kernel, all dims')}
        status, compressed_status, counts = [], [], []
        for qz, raw_q in zip(queries, raw):
            one, every = qz[None], raw_q[None]
            times = measure({'dense': lambda: dense.search_dense(matrix, one, K),
                             'pruned': lambda: search_as(matrix, one, 'pruned', copy),
                             'compressed': lambda: search_as(matrix, one, 'compressed', copy),
                             'kernel, all dims': lambda: kept.search_pruned(matrix, every, K)}, args.rounds)
            for side in totals:
                totals[side] += times[side]
            ref = dense.search_dense(matrix, one, K)
            atol = 1e-5 * float(np.abs(qz).sum())
            for path, into in (('pruned', status), ('compressed', compressed_status)):
                new = search_as(matrix, one, path, copy)
                into.append(check_topk(matrix, qz, (ref[0][0], ref[1][0]), (new[0][0], new[1][0]), atol))
            counts.append(rescored(matrix, copy, qz))
        frac = float(np.mean(queries != 0))
        per_query = {side: t / len(queries) for side, t in totals.items()}
        vs_pruned = ratio_stats(totals['pruned'], totals['compressed'])
        vs_dense = ratio_stats(totals['dense'], totals['compressed'])
        compressed_check = {s: compressed_status.count(s) for s in ('identical', 'ties', 'MISMATCH')}
        compressed_rows.append([name, f'{frac:.2f}', load(), f'{np.min(per_query["dense"]) * 1000:.1f} ms',
                                best_median(per_query['pruned']), best_median(per_query['compressed']),
                                f'**{fmt_ratio(vs_pruned)}**', fmt_ratio(vs_dense),
                                f'{np.mean(counts):.0f} (max {max(counts)})',
                                '/'.join(str(compressed_check[s]) for s in ('identical', 'ties', 'MISMATCH'))])
        pruned = ratio_stats(totals['dense'], totals['pruned'])
        own = ratio_stats(totals['kernel, all dims'], totals['pruned'])
        checks[name] = {s: status.count(s) for s in ('identical', 'ties', 'MISMATCH')}
        rows.append([name, f'{frac:.2f}', f'{np.min(totals["dense"]) / len(queries) * 1000:.0f} ms',
                     f'{np.min(totals["pruned"]) / len(queries) * 1000:.0f} ms', f'**{fmt_ratio(pruned)}**',
                     fmt_ratio(own),
                     '/'.join(str(checks[name][s]) for s in ('identical', 'ties', 'MISMATCH'))])
        result[name] = {'kept': frac, 'pruned_vs_dense': pruned, 'pruned_vs_kernel_all': own, 'check': checks[name],
                        'compressed_vs_pruned': vs_pruned,
                        'compressed_vs_dense': vs_dense, 'compressed_rescored': counts,
                        'compressed_check': compressed_check, 'load_average': load()}
    log('time per query = the least disturbed round; speed-up = min-over-rounds ratio (median, interquartile range '
        'of the per-round ratios) against the dense path (BLAS gemv + top-k); last speed-up: against the same '
        'compiled kernel '
        'fed the unpruned query (every dimension); top-100 identical / float ties only / mismatched against the dense '
        'path.\n')
    log(table(rows, ['queries', 'kept', 'dense (all dims)', 'pruned (kept dims)', 'pruned speed-up',
                     'vs kernel, all dims', 'top-100 id./ties/mism.']))
    log('\nThe compressed path (strategy="compressed") in the same rounds: the int8 copy\'s kept rows, then '
        'the documents its bound cannot rule out re-scored exactly. Times: best round / median round per query; '
        'speed-ups: min-over-rounds ratio (median, IQR); load: the 1-minute load average after the row; re-scored: '
        'documents re-scored exactly per query (the k best of the first pass included); top-100 against the dense '
        'path.\n')
    log(table(compressed_rows, ['queries', 'kept', 'load', 'dense', 'pruned (float32)', 'compressed (int8 + re-score)',
                                'compressed vs pruned', 'compressed vs dense', 're-scored', 'top-100 id./ties/mism.']))
    return result


def speed_split(dense_s: float, unpruned_s: float, pruned_s: float) -> dict:
    """Where the compressed path's speed-up over the dense path comes from, for one query: ``total`` (dense /
    compressed with the pruned query) is ``int8`` (dense / compressed with the unpruned query: quantisation alone)
    times ``pruning`` (compressed unpruned / compressed pruned), by construction."""
    return {'total': dense_s / pruned_s, 'int8': dense_s / unpruned_s, 'pruning': unpruned_s / pruned_s}


def split_sentence(name: str, kept_fraction: float, split: dict) -> str:
    """The split as a sentence: ``'RDIME (36 % of the dimensions kept): of the 9.25× over dense, ...'``."""
    return (f'{name} ({kept_fraction:.0%} of the dimensions kept): of the {split["total"]:.2f}× over dense, '
            f'{split["int8"]:.2f}× comes from int8 (compressed, unpruned) and {split["pruning"]:.2f}× from pruning '
            '(compressed pruned / compressed unpruned)')


def quantisation_split(matrix: np.ndarray, copy: Compressed, sets: dict, raw: np.ndarray, args) -> dict:
    """Section 1b: how much of the compressed path's speed comes from int8 and how much from pruning. In the same
    rounds, one query at a time: the dense path (float32, every dimension), the compressed path with the unpruned
    query (int8 alone), the float32 pruned path (pruning alone) and the compressed path with the pruned query (both);
    the top-100 of the unpruned compressed path checked against the dense path's for the same query."""
    log(f'\n### 1b. Where the speed comes from: int8 alone, pruning alone, both ({args.single} queries per row, '
        f'{args.rounds} rounds, timing: {args.timing})\n')
    measure = timing(args)
    rows, result = [], {}
    for name, queries in sets.items():
        queries = queries[:args.single]
        sides = ('dense', 'compressed, all dims', 'pruned', 'compressed')
        totals = {side: np.zeros(args.rounds) for side in sides}
        status, counts = [], []
        for qz, raw_q in zip(queries, raw):
            one, every = qz[None], raw_q[None]
            times = measure({'dense': lambda: dense.search_dense(matrix, one, K),
                             'compressed, all dims': lambda: carry_out(matrix, every, Plan('compressed'), copy),
                             'pruned': lambda: search_as(matrix, one, 'pruned', copy),
                             'compressed': lambda: search_as(matrix, one, 'compressed', copy)}, args.rounds)
            for side in sides:
                totals[side] += times[side]
            ref = dense.search_dense(matrix, every, K)
            new = carry_out(matrix, every, Plan('compressed'), copy)
            status.append(check_topk(matrix, raw_q, (ref[0][0], ref[1][0]), (new[0][0], new[1][0]),
                                     1e-5 * float(np.abs(raw_q).sum())))
            counts.append(rescored(matrix, copy, raw_q))
        per_query = {side: totals[side] / len(queries) for side in sides}
        best = {side: float(np.min(t)) for side, t in per_query.items()}
        split = speed_split(best['dense'], best['compressed, all dims'], best['compressed'])
        frac = float(np.mean(queries != 0))
        check = {s: status.count(s) for s in ('identical', 'ties', 'MISMATCH')}
        speedups = {side: ratio_stats(totals['dense'], totals[side]) for side in sides[1:]}
        rows.append([name, f'{frac:.2f}', best_median(per_query['dense']),
                     best_median(per_query['compressed, all dims']), fmt_ratio(speedups['compressed, all dims']),
                     best_median(per_query['pruned']), fmt_ratio(speedups['pruned']),
                     best_median(per_query['compressed']), f'**{fmt_ratio(speedups["compressed"])}**',
                     f'{split["int8"]:.2f}× · {split["pruning"]:.2f}× = {split["total"]:.2f}×',
                     f'{np.mean(counts):.0f} (max {max(counts)})',
                     '/'.join(str(check[s]) for s in ('identical', 'ties', 'MISMATCH')), load()])
        result[name] = {'kept': frac, 'best_s': best, 'split': split, 'speedups': speedups,
                        'unpruned_compressed_rescored': counts, 'unpruned_compressed_check': check,
                        'load_average': load()}
    log('dense = float32, every dimension (BLAS gemv + top-k); compressed, all dims = the compressed path '
        '(strategy="compressed") fed the unpruned query: the int8 copy\'s every row, then the documents its bound '
        'cannot rule out re-scored exactly (quantisation alone); pruned = float32, kept dimensions only (pruning '
        'alone); compressed = the compressed path with the pruned query (both). Times: best / median round per '
        'query; speed-ups over dense: min-over-rounds ratio (median, IQR); split = int8 (dense / compressed all dims) '
        '· pruning (compressed all dims / compressed) = the compressed speed-up, from the best rounds; re-scored and '
        'top-100 (against the dense path, same unpruned query): of the compressed path with the unpruned query.\n')
    log(table(rows, ['queries', 'kept', 'dense (float32, all dims)', 'compressed, all dims (int8 alone)',
                     'speed-up', 'pruned (float32, kept dims)', 'speed-up', 'compressed (int8, kept dims)',
                     'speed-up', 'split: int8 · pruning', 'all dims: re-scored', 'all dims: top-100 id./ties/mism.',
                     'load']))
    if 'RDIME' in result:
        log('\n' + split_sentence('RDIME', result['RDIME']['kept'], result['RDIME']['split']) + '.')
    return result


def batches(matrix: np.ndarray, copy: Compressed, sets: dict, args) -> dict:
    log(f'\n### 2. Batches ({args.rounds} rounds, timing: {args.timing})\n')
    measure = timing(args)
    rows, result = [], {}
    for size in args.batches:
        for name in ('RDIME', 'Top-k 0.50', 'Top-k 0.35'):
            queries = sets[name][:size]
            if len(queries) < size:
                continue
            times = measure({'dense': lambda: dense.search_dense(matrix, queries, K, batch_size=size),
                             'pruned': lambda: search_as(matrix, queries, 'pruned', copy),
                             'compressed': lambda: carry_out(matrix, queries, Plan('compressed'), copy),
                             'compressed one pass': lambda: carry_out(matrix, queries, Plan('compressed one pass'),
                                                                      copy),
                             'bare GEMM': lambda: queries @ matrix}, args.rounds)
            one_pass = plan_of(matrix, queries, 'pruned').path == 'one pass'
            ref = dense.search_dense(matrix, queries, K)
            atol = [1e-5 * float(np.abs(q).sum()) for q in queries]
            status = []
            for path in ('compressed', 'compressed one pass'):
                new = carry_out(matrix, queries, Plan(path), copy)
                status += [check_topk(matrix, q, (ref[0][i], ref[1][i]), (new[0][i], new[1][i]), atol[i])
                           for i, q in enumerate(queries)]
            pruned = ratio_stats(times['dense'], times['pruned'])
            bare = ratio_stats(times['bare GEMM'], times['pruned'])
            rows.append([size, name, f'{np.mean(queries != 0):.2f}', f'{np.mean((queries != 0).any(axis=0)):.2f}',
                         f'{np.min(times["dense"]) * 1000:.0f} ms', f'{np.min(times["pruned"]) * 1000:.0f} ms',
                         'one pass' if one_pass else 'one by one', f'**{fmt_ratio(pruned)}**', f'{bare["min"]:.2f}×',
                         estimates(matrix, queries), load(), f'{np.min(times["compressed"]) * 1000:.0f} ms',
                         fmt_ratio(ratio_stats(times['dense'], times['compressed'])),
                         f'{np.min(times["compressed one pass"]) * 1000:.0f} ms',
                         f"**{fmt_ratio(ratio_stats(times['dense'], times['compressed one pass']))}**",
                         '/'.join(str(status.count(s)) for s in ('identical', 'ties', 'MISMATCH'))])
            result[f'{size}/{name}'] = {'pruned_vs_dense': pruned, 'pruned_vs_bare_gemm': bare, 'one_pass': one_pass,
                                        'load_average': load(),
                                        'compressed_vs_dense': ratio_stats(times['dense'], times['compressed']),
                                        'compressed_one_pass_vs_dense': ratio_stats(times['dense'],
                                                                                    times['compressed one pass']),
                                        'compressed_check': {s: status.count(s) for s in ('identical', 'ties',
                                                                                          'MISMATCH')}}
    log('dense = one matrix product per batch and block of documents with the top-k merged block by block (the dense '
        'path); bare GEMM = one matrix product over the whole matrix, no top-k (a lower bound for dense); estimate = '
        'the cost model\'s cost of each path in gemv units; compressed = the int8 copy query after query, and in one '
        'pass (one exact int8 matrix product per slab of documents for the whole batch), with the top-100 of both '
        'against the dense path.\n')
    log(table(rows, ['batch', 'queries', 'kept', 'union kept', 'dense', 'pruned', 'pruned mode', 'pruned speed-up',
                     'vs bare GEMM', 'estimate', 'load', 'compressed, query by query', 'vs dense',
                     'compressed, one pass', 'vs dense', 'compressed top-100 id./ties/mism. (both)']))
    return result


def cell_batch(sets: dict, raw: np.ndarray, n: int, seed: int = 5) -> np.ndarray:
    """The rows of a retrieve-mode cell's call, system after system as ``search_together`` stacks them: ``n``
    queries pruned by Top-k at 25/35/50/75 %, a 10-point sweep (10-100 %), RDIME, the full query and two random
    subsets of half the dimensions (nested in nothing)."""
    rng = np.random.default_rng(seed)
    systems = [sets[f'Top-k {f:.2f}'][:n] for f in CELL_FRACTIONS] + [sets['RDIME'][:n], raw[:n]]
    systems += [np.where(rng.random(raw[:n].shape) < 0.5, raw[:n], 0) for _ in range(2)]
    return np.concatenate(systems).astype(np.float32)


#: The Top-k fractions of :func:`cell_batch`: the experiment's four, then its sweep.
CELL_FRACTIONS = (0.25, 0.35, 0.5, 0.75) + tuple(np.round(np.linspace(0.1, 1.0, 10), 2))


def nested_cell(matrix: np.ndarray, copy: Compressed, sets: dict, raw: np.ndarray, args) -> dict:
    """Section 2b: :func:`cell_batch` in one call of the compressed one pass, every row by the int8 product (as
    before nested rows) against the nested rows by prefix sums, and the compressed path query after query and the
    dense path on the same rows; best of 3 rounds (interleaved), results identical."""
    queries = cell_batch(sets, raw, args.nested)
    _, rows, _ = dense.nested_trees(queries)
    product = compressed.INT8_PRODUCT
    compressed.INT8_PRODUCT = args.int8_product or product
    default_cost = dense.NESTED_ADD_COST

    def one_pass(cost):
        dense.NESTED_ADD_COST = cost
        return carry_out(matrix, queries, Plan('compressed one pass'), copy)
    try:
        results = {side: one_pass(cost) for side, cost in (('unnested', 1e18), ('nested', default_cost))}
        times = interleaved({'unnested': lambda: one_pass(1e18), 'nested': lambda: one_pass(default_cost),
                             'query after query': lambda: carry_out(matrix, queries, Plan('compressed'), copy),
                             'dense': lambda: carry_out(matrix, queries, Plan('dense'), copy)}, 3)
    finally:
        dense.NESTED_ADD_COST, compressed.INT8_PRODUCT = default_cost, product
    same = all(np.array_equal(a, b) for side in (0, 1) for a, b in zip(results['unnested'][side],
                                                                      results['nested'][side]))
    ref = dense.search_dense(matrix, queries, K)
    status = [check_topk(matrix, q, (ref[0][i], ref[1][i]), (results['nested'][0][i], results['nested'][1][i]),
                         1e-5 * float(np.abs(q).sum())) for i, q in enumerate(queries)]
    row = {'rows': len(queries), 'nested_rows': len(rows), 'kept': float(np.mean(queries != 0)),
           'int8_product': args.int8_product or product, 'load_average': load(),
           **{f'{side.replace(" ", "_")}_s': float(np.min(seconds)) for side, seconds in times.items()},
           'identical_to_unnested': same, 'check_vs_dense': {s: status.count(s) for s in ('identical', 'ties',
                                                                                           'MISMATCH')}}
    log('\n### 2b. A cell-shaped batch in one call of the compressed one pass (best of 3, interleaved)\n')
    log(f'{args.nested} queries x {len(queries) // args.nested} systems = {len(queries)} rows ({row["kept"]:.2f} '
        f'kept), {len(rows)} of them nested; int8 product: {row["int8_product"]}; load {row["load_average"]}: every '
        f'row by the int8 product {row["unnested_s"]:.2f} s, nested rows by prefix sums {row["nested_s"]:.2f} s, '
        f'**{row["unnested_s"] / row["nested_s"]:.2f}×**; the compressed path query after query '
        f'{row["query_after_query_s"]:.2f} s ({row["query_after_query_s"] / row["nested_s"]:.2f}× the nested pass), '
        f'dense {row["dense_s"]:.2f} s ({row["dense_s"] / row["nested_s"]:.2f}×); results identical: {same}; '
        f'top-{K} against the dense path '
        f'(id./ties/mism.): {"/".join(str(c) for c in row["check_vs_dense"].values())}')
    return row


def cost_model(args) -> dict:
    """The cost model of this machine: calibrated now with ``--calibrate``, else loaded (or calibrated once)."""
    start = time.perf_counter()
    model = calibration.calibrate() if args.calibrate else calibration.model()
    seconds = time.perf_counter() - start
    log(f'cost model ({f"calibrated now in {seconds:.1f} s" if args.calibrate else "of this machine"}, '
        f'{calibration.cache_path()}): '
        + ', '.join(f'{k} {v:.3g}' for k, v in dataclasses.asdict(model).items()))
    return {'seconds': seconds, **dataclasses.asdict(model)}


def compressed_copy(retriever, matrix: np.ndarray, copy: layout.Codes, open_s: float) -> dict:
    """The int8 copy of the index: its size, and the time to build it again (into a temporary file beside it, removed
    after: the build of ``strategy='compressed'``'s first use, streamed from ``vecs.f4``, timed whether or not the
    copy existed)."""
    path = layout.compressed_path(Path(matrix.filename))
    scratch = path.with_name('bench-' + path.name)
    build_s, _ = timed(lambda: layout.build_compressed(retriever._layout.doc_rows(), scratch,
                                                        retriever._layout.abs_max()))
    scratch.unlink()
    log(f'int8 copy {path}: {copy.codes.nbytes / 2 ** 20:.0f} MiB ({copy.codes.nbytes / matrix.nbytes:.0%} of the '
        f'float32 vectors; opened in {open_s:.1f} s), built again from the page-cached vecs.f4 in {build_s:.1f} s '
        f'(load {load()}); largest per-dimension error / step: '
        f'{float(np.max(copy.error / copy.scale)):.3f}')
    return {'bytes': copy.codes.nbytes, 'build_s': build_s, 'open_s': open_s}


def faiss_vectors(index, threads: int):
    """``(vectors, seconds)``: FAISS's threads set, and the index's vectors read into memory (FAISS holds its own
    copy), with the time the read took."""
    import faiss
    faiss.omp_set_num_threads(threads)
    return timed(lambda: np.array(index.payload()[1], dtype=np.float32))[::-1]


def faiss_rows(index, matrix: np.ndarray, copy: Compressed, sets: dict, raw: np.ndarray, args) -> dict:
    """What a user would pick instead (``--faiss``, needs faiss-cpu and a second, in-memory copy of the vectors):
    FAISS's exact ``IndexFlatIP`` and an ``IVF{nlist},Flat`` index (trained on 64k sampled documents, nprobe 16 and
    64) with the full and with the RDIME-pruned query, one query at a time, against this package's paths; recall@100
    against the exact top-100 of the same query (the full query's from the dense path, the pruned query's from the
    pruned path)."""
    import faiss
    vecs, load_s = faiss_vectors(index, args.threads)
    docs, dims = vecs.shape
    flat = faiss.IndexFlatIP(dims)
    flat_s, _ = timed(lambda: flat.add(vecs))
    nlist = max(1, min(1024, docs // 64))
    ivf = faiss.IndexIVFFlat(faiss.IndexFlatIP(dims), dims, nlist, faiss.METRIC_INNER_PRODUCT)
    sample = np.sort(np.random.default_rng(0).choice(docs, size=min(docs, 65536), replace=False))
    start = time.perf_counter()
    ivf.train(vecs[sample])
    ivf.add(vecs)
    ivf_s = time.perf_counter() - start
    vecs = None  # each FAISS index holds its own copy
    pruned_q = sets['RDIME'][:args.single or 6]  # as many queries as the single-query rows, 6 without them
    full_q = raw[:len(pruned_q)]

    def ivf_search(nprobe):
        def run(q):
            ivf.nprobe = nprobe
            return ivf.search(q, K)
        return run
    systems = {
        ('dense (BLAS, this package)', 'full'): lambda q: dense.search_dense(matrix, q, K),
        ('pruned (this package)', 'pruned'): lambda q: search_as(matrix, q, 'pruned', copy),
        ('compressed (this package)', 'pruned'): lambda q: search_as(matrix, q, 'compressed', copy),
        ('FAISS IndexFlatIP', 'full'): lambda q: flat.search(q, K),
        ('FAISS IndexFlatIP', 'pruned'): lambda q: flat.search(q, K),
        **{(f'FAISS IVF{nlist},Flat nprobe {p}', kind): ivf_search(p) for p in (16, 64) for kind in ('full', 'pruned')},
    }
    exact = {'full': [dense.search_dense(matrix, q[None], K)[1][0] for q in full_q],
             'pruned': [kept.search_pruned(matrix, q[None], K)[1][0] for q in pruned_q]}
    measure = timing(args)
    totals = {key: np.zeros(args.rounds) for key in systems}
    for i in range(len(pruned_q)):
        one = {'full': full_q[i:i + 1], 'pruned': pruned_q[i:i + 1]}
        times = measure({key: (lambda fn=fn, q=one[key[1]]: fn(q)) for key, fn in systems.items()}, args.rounds)
        for key in systems:
            totals[key] += np.asarray(times[key])
    rows, result = [], {}
    for (name, kind), fn in systems.items():
        found = [np.asarray(fn(q[None])[1]).ravel() for q in (full_q if kind == 'full' else pruned_q)]
        recall = float(np.mean([len(set(f.tolist()) & set(e.tolist())) / len(e) for f, e in zip(found, exact[kind])]))
        per_query = totals[(name, kind)] / len(pruned_q)
        rows.append([name, kind, best_median(per_query), f'{recall:.3f}', load()])
        result[f'{name} / {kind}'] = {'best_s': float(np.min(per_query)), 'median_s': float(np.median(per_query)),
                                      'recall_at_100': recall}
    log(f'\n### 6. What a user would pick instead: FAISS {faiss.__version__} ({len(pruned_q)} RDIME queries, one at '
        f'a time, {args.rounds} rounds, {args.threads} thread(s))\n')
    log(f'FAISS holds its own in-memory copy of the vectors ({docs * dims * 4 / 2 ** 30:.2f} GiB, read in '
        f'{load_s:.0f} s); IndexFlatIP filled in {flat_s:.1f} s, IVF{nlist},Flat trained and filled in {ivf_s:.0f} s. '
        'recall@100: against the exact top-100 of the same query (full: the dense path; pruned: the pruned path); '
        'time per query: best / median round.\n')
    log(table(rows, ['system', 'query', 'time per query', 'recall@100', 'load']))
    return {'build_s': {'flat': flat_s, 'ivf': ivf_s, 'nlist': nlist}, 'rows': result}


def exact_top(matrix: np.ndarray, query_vec: np.ndarray, docs: int) -> np.ndarray:
    """The exact top-``K`` docids of ``query_vec`` among the first ``docs`` documents (the reference of an HNSW
    index built over them), scored in float64 over the dimension-major matrix."""
    scores = query_vec.astype(np.float64) @ np.asarray(matrix[:, :docs], dtype=np.float64)
    top = np.argpartition(-scores, K - 1)[:K]
    return top[np.argsort(-scores[top], kind='stable')]


def faiss_quantised_rows(index, matrix: np.ndarray, copy: Compressed, sets: dict, raw: np.ndarray, args) -> dict:
    """Section 7 (``--faiss``): the approximate alternatives a user would weigh against the exact compressed path,
    one query at a time, in the same rounds as this package's dense and compressed paths: FAISS's 8-bit scalar
    quantiser with an exact re-ranking of the top k·r (``IndexScalarQuantizer`` QT_8bit in ``IndexRefineFlat``,
    r = 1, 2, 4) and HNSW (``IndexHNSWFlat``, M = 32, efSearch 128 to 1024; cached on disk, built on the first
    ``--hnsw-docs`` documents where given), each with the full and with the RDIME-pruned query; recall@100 against
    the exact top-100 of the same query (over the documents the index holds)."""
    import gc

    import faiss
    from faiss_indexes import HNSW_EF_CONSTRUCTION, HNSW_M, hnsw_index, hnsw_path, recall_at, sq8_refine
    gc.collect()  # section 6's FAISS indexes go first: memory for two more copies of the vectors
    source = index.payload()[1]
    vecs, load_s = faiss_vectors(index, args.threads)
    docs, dims = vecs.shape
    sample = np.sort(np.random.default_rng(0).choice(docs, size=min(docs, 65536), replace=False))
    refine, sq8_s = sq8_refine(vecs, args.threads, sample)
    vecs = None  # the refine index holds its own copy
    hnsw_docs = min(args.hnsw_docs or docs, docs)
    hnsw, record = hnsw_index(source, hnsw_path(args.cache, index.index_path, hnsw_docs), hnsw_docs,
                              threads=args.threads)
    faiss.omp_set_num_threads(args.threads)
    pruned_q = sets['RDIME'][:args.single or 6]
    full_q = raw[:len(pruned_q)]
    queries = {'full': full_q, 'pruned': pruned_q}

    def sq8(r):
        def run(q):
            refine.k_factor = r
            return refine.search(q, K)
        return run

    def graph(ef):
        def run(q):
            hnsw.hnsw.efSearch = ef
            return hnsw.search(q, K)
        return run
    hnsw_name = f'FAISS HNSW{HNSW_M},Flat' + (f' (first {hnsw_docs:,} docs)' if hnsw_docs < docs else '')
    systems = {
        ('dense (BLAS, this package)', 'full'): lambda q: dense.search_dense(matrix, q, K),
        ('compressed, all dims (this package)', 'full'): lambda q: carry_out(matrix, q, Plan('compressed'), copy),
        ('compressed (this package)', 'pruned'): lambda q: search_as(matrix, q, 'compressed', copy),
        **{(f'FAISS SQ8 + IndexRefineFlat r = {r}', kind): sq8(r) for r in (1, 2, 4) for kind in ('full', 'pruned')},
        **{(f'{hnsw_name} efSearch {ef}', kind): graph(ef) for ef in HNSW_EF_SEARCH for kind in ('full', 'pruned')},
    }
    exact = {'full': [dense.search_dense(matrix, q[None], K)[1][0] for q in full_q],
             'pruned': [kept.search_pruned(matrix, q[None], K)[1][0] for q in pruned_q]}
    exact_hnsw = exact if hnsw_docs == docs else {kind: [exact_top(matrix, q, hnsw_docs) for q in qs]
                                                   for kind, qs in queries.items()}
    measure = timing(args)
    totals = {key: np.zeros(args.rounds) for key in systems}
    for i in range(len(pruned_q)):
        one = {kind: qs[i:i + 1] for kind, qs in queries.items()}
        times = measure({key: (lambda fn=fn, q=one[key[1]]: fn(q)) for key, fn in systems.items()}, args.rounds)
        for key in systems:
            totals[key] += np.asarray(times[key])
    dense_s = totals[('dense (BLAS, this package)', 'full')]
    rows, result = [], {}
    for (name, kind), fn in systems.items():
        found = [np.asarray(fn(q[None])[1]).ravel() for q in queries[kind]]
        recall = recall_at(found, (exact_hnsw if name.startswith(hnsw_name) else exact)[kind])
        per_query = totals[(name, kind)] / len(pruned_q)
        speedup = ratio_stats(dense_s, totals[(name, kind)])
        rows.append([name, kind, best_median(per_query), fmt_ratio(speedup), f'{recall:.3f}', load()])
        result[f'{name} / {kind}'] = {'best_s': float(np.min(per_query)), 'median_s': float(np.median(per_query)),
                                      'vs_dense': speedup, 'recall_at_100': recall}
    built = 'read from its cache, built earlier' if record['cached'] else 'built now'
    log(f'\n### 7. Approximate int8 and graph search: FAISS {faiss.__version__} SQ8 + exact re-ranking, HNSW '
        f'({len(pruned_q)} RDIME queries, one at a time, {args.rounds} rounds, {args.threads} thread(s))\n')
    log(f'vectors read in {load_s:.0f} s; IndexScalarQuantizer (QT_8bit, inner product; {docs * dims / 2 ** 30:.2f} '
        f'GiB of codes) in IndexRefineFlat (its own float32 copy) trained on {len(sample):,} documents and filled in '
        f'{sq8_s:.0f} s; IndexHNSWFlat M = {HNSW_M}, efConstruction {HNSW_EF_CONSTRUCTION}, over '
        f'{hnsw_docs:,} of {docs:,} documents: {built} in {record["build_s"]:.0f} s with {record["threads"]} '
        f'thread(s) (load {record["load_average"]:.1f}). r: IndexRefineFlat\'s k_factor, the SQ8 scan\'s top k·r '
        're-ranked exactly in float32. recall@100: against the exact top-100 of the same query (full: the dense '
        'path; pruned: the pruned path' + ('' if hnsw_docs == docs else f'; HNSW: over its first {hnsw_docs:,} '
                                           'documents') + '); time per query: best / median round; vs dense: '
        'min-over-rounds ratio (median, IQR) against the dense path in the same rounds.\n')
    log(table(rows, ['system', 'query', 'time per query', 'vs dense', 'recall@100', 'load']))
    return {'build_s': {'sq8_refine': sq8_s, 'hnsw': record['build_s'], 'hnsw_cached': record['cached'],
                        'hnsw_docs': hnsw_docs}, 'rows': result}


def real_pool(args) -> list:
    from pyterrier_rdime import SwcDime
    from pyterrier_rdime.experiment.collection import load_collection
    from pyterrier_rdime.experiment.encoders import load_encoder
    from pyterrier_rdime.experiment.indexes import dense_index, first_stage_results

    collection = load_collection(str(args.collection))
    first, _ = first_stage_results(collection, 'run', 100, args.cache)
    model = load_encoder('minilm', verbose=False)
    index = dense_index(collection, model, 'minilm', args.cache, first['docno'].unique(), verbose=False)
    queries = model.query_encoder()(collection.topics)
    dense = PrunedRetriever(index=index, num_results=K, strategy='dense')
    pruned = PrunedRetriever(index=index, num_results=K, strategy='pruned')
    auto = PrunedRetriever(index=index, num_results=K)
    squeezed = PrunedRetriever(index=index, num_results=K, strategy='compressed')
    feedback = PrunedRetriever(index=index, num_results=10, strategy='dense') >> index.vec_loader()
    matrix = dense.dim_major()
    rows = []
    for name, dime in (('PRF+RDIME', PrfDime(keep_ranking=False)), ('SWC+RDIME', SwcDime(keep_ranking=False))):
        q = (feedback >> dime >> Rdime())(queries)
        a, b, c, d = dense(q), pruned(q), index.np_retriever(num_results=K)(q), squeezed(q)
        qv = np.stack(q['query_vec']).astype(np.float32)
        status, squeezed_status = [], []
        for i, qid in enumerate(q['qid']):
            atol = 1e-5 * float(np.abs(qv[i]).sum())
            ra, rb, rc = a[a['qid'] == qid], b[b['qid'] == qid], c[c['qid'] == qid]
            ref = (ra['score'].to_numpy(), ra['docid'].to_numpy())
            status.append(check_topk(matrix, qv[i], ref, (rb['score'].to_numpy(), rb['docid'].to_numpy()), atol))
            status.append(check_topk(matrix, qv[i], ref, (rc['score'].to_numpy().astype(np.float32),
                                                          rc['docid'].to_numpy()), atol))
            rd = d[d['qid'] == qid]
            squeezed_status.append(check_topk(matrix, qv[i], ref, (rd['score'].to_numpy().astype(np.float32),
                                                                   rd['docid'].to_numpy()), atol))
        one = [q.iloc[[i]] for i in range(len(q))]
        times = interleaved({'dense': lambda: [dense(x) for x in one], 'pruned': lambda: [pruned(x) for x in one],
                             'auto': lambda: [auto(x) for x in one]}, args.rounds * 2)
        rows.append([name, len(q), f'{np.mean(qv != 0):.2f}', fmt_ratio(ratio_stats(times['dense'], times['pruned'])),
                     auto.plan(qv[:1]).strategy, fmt_ratio(ratio_stats(times['dense'], times['auto'])),
                     f'{status.count("identical")}/{status.count("ties")}/{status.count("MISMATCH")}',
                     '/'.join(str(squeezed_status.count(s)) for s in ('identical', 'ties', 'MISMATCH'))])
    log(f'\n### 5. Real pool vectors ({matrix.shape[1]:,} x {matrix.shape[0]}, MiniLM; stage level, one query per '
        "call; exactness against the dense path and pyterrier-dr's np_retriever)\n")
    log(table(rows, ['queries', 'n', 'kept', 'pruned vs dense', "auto's choice", 'auto vs dense',
                     'top-100 id./ties/mism.', 'compressed top-100 id./ties/mism.']))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    common.synthetic_index_options(parser)
    parser.add_argument('--single', type=int, default=12, help='queries per row, one at a time (0: none)')
    parser.add_argument('--batches', default='8,64', help="batch sizes ('' for none)")
    parser.add_argument('--rounds', type=int, default=5, help='repetitions (rounds)')
    parser.add_argument('--timing', choices=('blocks', 'interleaved'), default='blocks',
                        help='blocks: each side runs --per-block times in a row per round, the fastest kept (the '
                             "first call absorbs most of the other side's spinning threads; benchmark 'switch' shows "
                             'the rest); interleaved: one call per side per round')
    parser.add_argument('--per-block', type=int, default=3)
    parser.add_argument('--nested', type=int, default=8, help='queries of the cell-shaped batch of 2b (0: none)')
    parser.add_argument('--int8-product', choices=('torch', 'float64'),
                        help="the one pass's int8 product in 2b (default: the package's, compressed.INT8_PRODUCT)")
    parser.add_argument('--collection', type=Path, default=common.DEFAULT_COLLECTION)
    parser.add_argument('--calibrate', action='store_true', help="re-calibrate the cost model of strategy='auto'")
    parser.add_argument('--faiss', action='store_true',
                        help='also time FAISS (exact IndexFlatIP, an IVF index, SQ8 with re-ranking and HNSW, full '
                             'and pruned queries; needs faiss-cpu and memory for two more copies of the vectors)')
    parser.add_argument('--hnsw-docs', type=int, help='with --faiss: build the HNSW index over the first N documents '
                                                      'only (default: all; a 1M x 768 build takes ~20 min on two '
                                                      'cores, cached after)')
    args = parser.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(',') if b]
    info = common.machine()
    limiter = common.set_threads(args.threads)
    log(f'## Pruned exact search: top-{K} over {args.docs:,} x {args.dims} float32\n')
    log(common.describe_machine(info, args.threads) + f'; compiled kernel: {kept.NUMBA_AVAILABLE}')
    args.cache.mkdir(parents=True, exist_ok=True)
    gen_s, (index, state) = timed(lambda: common.synthetic_flex_index(args.cache, args.docs, args.dims))
    retriever = PrunedRetriever(index=index, num_results=K, strategy='compressed', verbose=True)
    layout_s, matrix = timed(retriever.dim_major)
    log(f'synthetic index {index.index_path} ready in {gen_s:.0f} s; layout {matrix.filename} ready in {layout_s:.0f} '
        f's ({matrix.nbytes / 2 ** 30:.2f} GiB, memory-mapped; building it once is measured by `run.py layout`)')
    copy_s, codes = timed(retriever._layout.codes)
    copy = Compressed(codes, retriever._layout.doc_rows())
    results = {'compressed_copy': compressed_copy(retriever, matrix, codes, copy_s)}
    raw = make_queries(state, max(args.batches + [args.single, args.nested, 6]))
    fractions = (0.25, 0.35, 0.5, 0.75) + (CELL_FRACTIONS if args.nested else ())
    prep_s, sets = timed(lambda: pruned_query_sets(index, matrix, raw, sorted(set(fractions))))
    kept.search_pruned(matrix, sets['RDIME'][:2], K)  # compile (or load) the kernel, warm the page cache
    log(f'{len(raw)} queries pruned in {prep_s:.0f} s (PRF DIME M=2 from the exact top-10); kept fraction of RDIME: '
        f'mean {np.mean(sets["RDIME"] != 0):.2f}')
    results['cost_model'] = cost_model(args)
    if args.single:
        results['single'] = single_queries(matrix, copy, sets, raw, args)
        results['split'] = quantisation_split(matrix, copy, sets, raw, args)
    results['batches'] = batches(matrix, copy, sets, args)
    if args.nested:
        results['nested_cell'] = nested_cell(matrix, copy, sets, raw, args)
    if args.collection.is_dir():
        results['real_pool'] = real_pool(args)
    if args.faiss:
        results['faiss'] = faiss_rows(index, matrix, copy, sets, raw, args)
        results['faiss_approximate'] = faiss_quantised_rows(index, matrix, copy, sets, raw, args)
    log(f'\nload average at end: {", ".join(f"{x:.1f}" for x in common.os.getloadavg())}; peak RSS '
        f'{common.max_rss_gib():.2f} GiB (the memory-mapped layout counts where its pages are resident)')
    limiter.unregister()
    if args.json:
        common.write_json(args.json, info, args, results)
    return 0


if __name__ == '__main__':
    sys.exit(main())
