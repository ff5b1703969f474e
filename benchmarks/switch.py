#!/usr/bin/env python
"""What does a query pay for the threads of the call before it?

With two threads, the single-query medians of ``search`` fall below its best rounds while one thread's do not. This
times one query at a time over the synthetic index of ``search`` (top-100; one query pruned by RDIME, ~35 % kept,
and by Top-k 0.50), each path in four situations, round after round: right after a call of the *other* path (its
threads may still be spinning: OpenBLAS's workers spin a while after each call before they sleep), right after a
call of the *same* path (back to back), right after encoding a query with MiniLM (what ``pipe.search(query)`` does
before it retrieves; torch on its default threads), and after ``--idle`` seconds of idleness (every worker asleep:
one query after a pause).
Min and median over rounds, and the speed-up of pruned over dense in each situation.

Run it twice to see the cause: as is, and with OpenBLAS's workers told to sleep at once
(``OPENBLAS_THREAD_TIMEOUT=4``, read when numpy loads).

Usage (from the repository root)::

    python benchmarks/run.py switch
    OPENBLAS_THREAD_TIMEOUT=4 python benchmarks/run.py switch
"""
import argparse
import sys
import time

import common  # first: it sets the environment (offline hub, temporary PyTerrier homes)
import numpy as np
import pandas as pd
from common import log, table, timed

from pyterrier_rdime import PrunedRetriever
from pyterrier_rdime.experiment.encoders import load_encoder
from pyterrier_rdime.pruned import dense, kept

K = 100


def main(argv=None) -> int:
    from search import make_queries, pruned_query_sets
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    common.synthetic_index_options(parser)
    parser.add_argument('--rounds', type=int, default=20)
    parser.add_argument('--idle', type=float, default=0.4, help='seconds of idleness before the "after idle" calls')
    args = parser.parse_args(argv)
    timeout = common.os.environ.get('OPENBLAS_THREAD_TIMEOUT', 'unset (OpenBLAS default)')
    title = f'## The switch between paths: one query, top-{K} over {args.docs:,} x {args.dims}\n'
    with common.session(args, args.threads, title, f'; OPENBLAS_THREAD_TIMEOUT {timeout}') as run:
        index, state = common.synthetic_flex_index(args.cache, args.docs, args.dims)
        matrix = PrunedRetriever(index=index).dim_major()
        queries = pruned_query_sets(index, matrix, make_queries(state, 1), (0.5,))
        paths = {}
        for name, query in queries.items():
            paths['dense', name] = lambda q=query: dense.search_dense(matrix, q, K)
            paths['pruned', name] = lambda q=query: kept.search_pruned(matrix, q, K)
        encoder = load_encoder('minilm').query_encoder()
        topic = pd.DataFrame({'qid': ['1'], 'query': ['what is the effect of dimension pruning on dense retrieval']})
        for path in paths.values():  # compile, warm the page cache
            path()
        situations = ('after the other path', 'back to back', 'after a query encoding', 'after idle')
        times = {(path, situation): [] for path in paths for situation in situations}
        for _ in range(args.rounds):
            for name in queries:
                for side, other in (('dense', 'pruned'), ('pruned', 'dense')):
                    path = side, name
                    paths[other, name]()
                    times[path, 'after the other path'].append(timed(paths[path])[0])
                    times[path, 'back to back'].append(timed(paths[path])[0])
                    encoder(topic)
                    times[path, 'after a query encoding'].append(timed(paths[path])[0])
                    time.sleep(args.idle)
                    times[path, 'after idle'].append(timed(paths[path])[0])
        rows = []
        for name, query in queries.items():
            for situation in situations:
                d, p = np.array(times[('dense', name), situation]), np.array(times[('pruned', name), situation])
                rows.append([name, f'{np.mean(query != 0):.2f}', situation,
                             f'{d.min() * 1000:.0f} / {np.median(d) * 1000:.0f} ms',
                             f'{p.min() * 1000:.0f} / {np.median(p) * 1000:.0f} ms',
                             f'{d.min() / p.min():.2f}× (median {np.median(d) / np.median(p):.2f}×)'])
        log(f'{args.rounds} rounds\n')
        log(table(rows, ['query', 'kept', 'situation', 'dense, min / median', 'pruned, min / median',
                         'pruned speed-up']))
        run['results'].update({f'{side} {name} {s}': t for ((side, name), s), t in times.items()})
    return 0


if __name__ == '__main__':
    sys.exit(main())
