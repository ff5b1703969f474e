#!/usr/bin/env python
"""What does building PrunedRetriever's on-disk dimension-major layout cost, and does it fit an MS MARCO index?

Builds the layout of seeded synthetic FlexIndexes (cached, see ``search.py``) of several sizes, each in a fresh
child process so that its peak resident memory is its own, and projects build time and memory to 8.8M x 768 (the
MS MARCO passage corpus): the build streams the index in blocks, so its memory should not grow with the index and
its time should grow linearly.

Usage (from the repository root)::

    python benchmarks/run.py layout                          # 250k and 1M x 768 (~2 min after the first run)
    python benchmarks/run.py layout --docs 1000000 --dims 768
"""
import argparse
import json
import subprocess
import sys
from pathlib import Path

import common
from common import log, table

MSMARCO_DOCS = 8_841_823


def child(source: str, target: str) -> None:
    """Build the layout of the FlexIndex at ``source`` into ``target``; print time and peak memory as JSON."""
    import time

    from pyterrier_dr import FlexIndex

    from pyterrier_rdime.pruned import layout
    start = time.perf_counter()
    docnos, vecs, _ = FlexIndex(source, verbose=False).payload()
    layout.build_layout(vecs, Path(target), docnos=docnos.fwd, source=source)
    print(json.dumps({'seconds': time.perf_counter() - start, 'peak_rss_gib': common.max_rss_gib()}))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--docs', default='250000,1000000', help='comma-separated index sizes')
    parser.add_argument('--dims', type=int, default=768)
    parser.add_argument('--cache', type=Path, default=common.DEFAULT_CACHE)
    parser.add_argument('--json', type=Path)
    parser.add_argument('--child', nargs=2, metavar=('SOURCE', 'TARGET'), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(*args.child)
        return 0
    with common.session(args, None, '## Building the dimension-major layout\n') as run:  # each build in a child
        rows, results = [], []
        for docs in [int(d) for d in args.docs.split(',')]:
            index, _ = common.synthetic_flex_index(args.cache, docs, args.dims)
            target = Path(index.index_path) / 'bench-layout.npy'
            try:
                out = subprocess.run([sys.executable, __file__, '--child', str(index.index_path), str(target)],
                                     check=True, capture_output=True, text=True)
            finally:
                target.unlink(missing_ok=True)
            measured = json.loads(out.stdout.strip().splitlines()[-1])
            gib = docs * args.dims * 4 / 2 ** 30
            results.append({'docs': docs, 'dims': args.dims, 'layout_gib': gib, **measured})
            rows.append([f'{docs:,} x {args.dims}', f'{gib:.2f} GiB', f'{measured["seconds"]:.0f} s',
                         f'{gib / measured["seconds"] * 1024:.0f} MiB/s', f'{measured["peak_rss_gib"]:.2f} GiB'])
        largest = max(results, key=lambda r: r['docs'])
        scale = MSMARCO_DOCS / largest['docs']
        rows.append([f'{MSMARCO_DOCS:,} x {args.dims} (projected)', f'{MSMARCO_DOCS * args.dims * 4 / 2 ** 30:.1f} GiB',
                     f'~{largest["seconds"] * scale / 60:.0f} min', '(same)', f'~{largest["peak_rss_gib"]:.2f} GiB'])
        log('\neach build in a fresh process, reading the cached index (in the page cache when recently used) and '
            'writing the layout beside it, flushed to disk; peak RSS of that process (Python, numpy and pyterrier '
            'included).\n')
        log(table(rows, ['index', 'layout size', 'build time', 'throughput', 'peak RSS']))
        log(f'\nprojection: time x {scale:.1f} (a sequential read and a blocked write), memory unchanged (blocks of '
            'a fixed size); the layout needs as much free disk as the index.')
        run['results']['layout'] = results
    return 0


if __name__ == '__main__':
    sys.exit(main())
