#!/usr/bin/env python
"""Does ``strategy='auto'`` take the fastest path, on this CPU and thread count?

Over the seeded synthetic FlexIndex of ``search`` (default 1M x 768, top-100, its float32 layout and int8 copy on
disk), for the rows of ``search`` (one query at a time at RDIME's fraction and Top-k 25/35/50/75 %; batches of 8 and
64 at RDIME's fraction, 35 % and 50 %): every exact path timed in blocks (dense; pruned query by query; its one pass;
compressed query by query; its one pass; a single query has no one pass), the cost model's own choice (the prior,
which ``'auto'`` used alone before it measured), and ``PrunedRetriever(strategy='auto')`` itself, timed in the same
rounds after it has explored: its path, its time against the fastest path's (goal: within 2 %, every row), and what
exploring cost (its exploring calls and their time beyond that of the path it then took). The record of measured
timings of the index is deleted first, so that every row explores from nothing; auto's results are checked against
the dense path's.

Usage (from the repository root)::

    python benchmarks/run.py auto                    # 1M x 768, 2 threads, ~10 min
    python benchmarks/run.py auto --threads 1
    python benchmarks/run.py auto --docs 200000 --single 3 --rounds 2    # a quick check
"""
import argparse
import sys

import common  # first: it sets the environment (offline hub, temporary PyTerrier homes)
import numpy as np
from common import log, ratio_stats, table, timed
from search import Compressed, K, carry_out, check_topk, make_queries, pruned_query_sets

from pyterrier_rdime import PrunedRetriever
from pyterrier_rdime.pruned import calibration, dense, kept, planner
from pyterrier_rdime.pruned.planner import Plan

#: Exploring calls per row are capped: a row whose choice still explores after this many passes is reported so.
MAX_EXPLORE_PASSES = 8
GOAL = 0.98


def model_choice(matrix: np.ndarray, queries: np.ndarray) -> str:
    """The path of least estimated cost: what ``'auto'`` took before it measured."""
    return planner.choose(queries, strategy='auto', matrix_bytes=matrix.nbytes, compiled=kept.NUMBA_AVAILABLE,
                          model=calibration.model, k=K).path


def exploring(auto: PrunedRetriever, queries: np.ndarray) -> bool:
    """Whether ``auto``'s next call on these queries explores (or re-checks) a path: not when it has one candidate,
    or scores densely without asking the model (a matrix in the CPU caches)."""
    return auto.choice(queries).reason in ('explore', 'recheck')


def explore(auto: PrunedRetriever, calls) -> list:
    """Runs ``auto`` on each call (an array of queries) while its choice for any of them explores; returns
    ``(call index, seconds)`` of every call made."""
    made = []
    for _ in range(MAX_EXPLORE_PASSES):
        pending = [i for i, q in enumerate(calls) if exploring(auto, q)]
        if not pending:
            break
        for i in pending:
            made.append((i, timed(lambda: auto.search(calls[i]))[0]))
    return made


def row(name: str, matrix: np.ndarray, copy: Compressed, auto: PrunedRetriever, calls, paths, args) -> list:
    """One row: every path and auto over ``calls`` (a list of query arrays, summed), after auto has explored."""
    explored = explore(auto, calls)
    fns = {path: (lambda path=path: [carry_out(matrix, q, Plan(path), copy) for q in calls]) for path in paths}
    fns['auto'] = lambda: [auto.search(q) for q in calls]
    times = common.blocks(fns, args.rounds, args.per_block)
    best = {path: min(values) for path, values in times.items()}
    fastest = min(paths, key=best.get)
    versus = ratio_stats(times[fastest], times['auto'])  # fastest / auto per round: 1.00 = as fast
    # auto's time per call, as taken after exploring (its calls run one after the other in a round)
    per_call = [min(timed(lambda: auto.search(q))[0] for _ in range(args.per_block)) for q in calls]
    extra = sum(seconds - per_call[i] for i, seconds in explored)
    choices = sorted({auto.plan(q).path for q in calls})
    prior = sorted({model_choice(matrix, q) for q in calls})
    still = sum(exploring(auto, q) for q in calls)
    status = []
    for q in calls:
        ref, new = dense.search_dense(matrix, q, K), auto.search(q)
        status += [check_topk(matrix, q[i], (ref[0][i], ref[1][i]), (new[0][i], new[1][i]),
                              1e-5 * float(np.abs(q[i]).sum())) for i in range(len(q))]
    prior_time = np.mean([best[path] for path in prior]) if all(p in best for p in prior) else float('nan')
    return [name, f'{np.mean([np.mean(q != 0) for q in calls]):.2f}',
            ' · '.join(f'{path} {best[path] * 1000:.1f}' for path in paths), fastest,
            f'{"/".join(prior)} ({best[fastest] / prior_time:.3f}×)', '/'.join(choices),
            f'**{versus["min"]:.3f}×** ({versus["median"]:.3f}×)' + ('' if versus['min'] >= GOAL else ' ✘'),
            f'{len(explored)} calls, +{extra * 1000:.0f} ms' + (f' ({still} still exploring)' if still else ''),
            '/'.join(str(status.count(s)) for s in ('identical', 'ties', 'MISMATCH')),
            f'{common.os.getloadavg()[0]:.1f}'], versus['min']


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    common.synthetic_index_options(parser)
    parser.add_argument('--single', type=int, default=6, help='queries per single-query row, one at a time')
    parser.add_argument('--batches', default='8,64', help="batch sizes ('' for none)")
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--per-block', type=int, default=3)
    args = parser.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(',') if b]
    info = common.machine()
    limiter = common.set_threads(args.threads)
    log(f'## strategy="auto" against the fastest path: top-{K} over {args.docs:,} x {args.dims} float32\n')
    log(common.describe_machine(info, args.threads) + f'; compiled kernel: {kept.NUMBA_AVAILABLE}')
    args.cache.mkdir(parents=True, exist_ok=True)
    index, state = common.synthetic_flex_index(args.cache, args.docs, args.dims)
    forced = PrunedRetriever(index=index, num_results=K, strategy='pruned', verbose=True)
    matrix = forced.dim_major()
    copy = Compressed(forced._layout.codes(), forced._layout.doc_rows())
    auto = PrunedRetriever(index=index, num_results=K, strategy='auto', verbose=True)
    raw = make_queries(state, max(args.batches + [args.single]))
    sets = pruned_query_sets(index, matrix, raw, (0.25, 0.35, 0.5, 0.75))
    record = auto._measured.record()
    record.unlink(missing_ok=True)
    calibration.model(verbose=True)
    log(f'measured timings of the index: {record} (deleted: every row explores from nothing)\n')
    rows, ratios = [], []
    singles = ('dense', 'pruned', 'compressed')
    for name, queries in sets.items():
        if args.single:
            line, ratio = row(f'1 × {name}', matrix, copy, auto, [q[None] for q in queries[:args.single]], singles,
                              args)
            rows.append(line)
            ratios.append(ratio)
            log(' | '.join(map(str, line)))
    for size in args.batches:
        for name in ('RDIME', 'Top-k 0.50', 'Top-k 0.35'):
            line, ratio = row(f'{size} × {name}', matrix, copy, auto, [sets[name][:size]],
                              ('dense', 'pruned', 'one pass', 'compressed', 'compressed one pass'), args)
            rows.append(line)
            ratios.append(ratio)
            log(' | '.join(map(str, line)))
    log('\nper row: best round (ms, a single-query row sums its queries) of each path; the fastest; the cost model\'s '
        'choice alone (what auto took before it measured) and the fastest path\'s time over its; auto\'s path after '
        f'exploring and auto / fastest, min-over-rounds ratio (median) (✘: below the goal, {GOAL}); what exploring '
        'cost: its calls and their time beyond that of the path auto then took; auto\'s top-100 against the dense '
        'path (identical / float ties / mismatched); load average.\n')
    log(table(rows, ['row', 'kept', 'paths (ms)', 'fastest', 'model alone', 'auto', 'auto / fastest', 'exploring',
                     'top-100', 'load']))
    log(f'\nauto within {100 * (1 - GOAL):.0f} % of the fastest path in {sum(r >= GOAL for r in ratios)} of '
        f'{len(ratios)} rows; worst {min(ratios):.3f}×; load average at end '
        f'{", ".join(f"{x:.1f}" for x in common.os.getloadavg())}')
    limiter.unregister()
    if args.json:
        common.write_json(args.json, info, args, {'rows': rows, 'auto_vs_fastest': ratios})
    return 0


if __name__ == '__main__':
    sys.exit(main())
