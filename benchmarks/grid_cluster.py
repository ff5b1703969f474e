#!/usr/bin/env python
"""A grid's cells as Ray tasks against the same grid one cell after another: ``rdime-experiment`` over the four
shared collections (cranfield, cisi, vaswani, the DL19 pool) with MiniLM, a few queries each, first serially, then
with ``--cells 3`` on a local ``ray.cluster_utils.Cluster`` of three nodes of 1 CPU each (the head included). Prints
both wall times, the start-up of the cluster, each cell's own time, the overhead of the cluster run over its slowest
cells, and whether the output files are equal (but for the timings of each results.json).

The caches (dense and BM25 indexes, kept in ``<benchmark cache>/grid_cluster``) are built by a first, untimed serial
run, so that both timed runs read them. Each cell's own time is split into its ``load`` phase (imports done, the
encoder loaded: cold in a fresh worker process of a node) and the rest. This machine's 2 cores bound any speed-up:
three 1-CPU nodes share them. Usage (from the repository root)::

    python benchmarks/run.py grid_cluster                    # 20 queries per collection (~1.5 min; 11-13 the first)
    python benchmarks/run.py grid_cluster --max-queries 10
"""
import argparse
import contextlib
import io
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from common import DEFAULT_CACHE, ROOT, log  # before the package: it sets the environment (offline hub, homes)

from pyterrier_rdime.experiment.cli import main as command

COLLECTIONS = [str(ROOT.parent / 'shared' / 'data' / name) for name in ('cranfield', 'cisi', 'vaswani',
                                                                        'msmarco-dl19-pool')]
NODES = 3


def run(argv) -> float:
    """Seconds of the command, which must succeed (its tables go nowhere)."""
    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        code = command(argv)
    if code != 0:
        raise RuntimeError(f'rdime-experiment {" ".join(argv)} exited {code}')
    return time.perf_counter() - started


def outputs(folder: Path) -> dict:
    """Each output file's content, results.json without its timings."""
    found = {}
    for path in sorted(p for p in folder.rglob('*') if p.is_file() and '.progress' not in p.parts):
        content = path.read_bytes()
        if path.name == 'results.json':
            payload = json.loads(content)
            payload.pop('timings')
            content = json.dumps(payload, sort_keys=True).encode()
        found[path.relative_to(folder).as_posix()] = content
    return found


def cell_seconds(folder: Path) -> dict:
    """Each cell's ``(total, load)`` seconds, as it recorded them."""
    timings = {p.parent.parent.name: json.loads(p.read_text())['timings']
               for p in sorted(folder.glob('*/*/results.json'))}
    return {name: (t['total'], t.get('load', 0.0)) for name, t in timings.items()}


def described(cells: dict) -> str:
    return ', '.join(f'{name} {total:.1f} (load {load:.1f})' for name, (total, load) in cells.items())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--max-queries', type=int, default=20)
    args = parser.parse_args(argv)
    import ray
    from ray.cluster_utils import Cluster
    os.environ.setdefault('RAY_USAGE_STATS_ENABLED', '0')
    folder = Path(tempfile.mkdtemp(prefix='bench-rdime-grid-cluster-'))
    common = COLLECTIONS + ['--encoder', 'minilm', '--max-queries', str(args.max_queries), '--quiet',
                            '--cache', str(DEFAULT_CACHE / 'grid_cluster')]
    try:
        log(f'# grid_cluster: {len(COLLECTIONS)} cells (4 collections x MiniLM, {args.max_queries} queries each); '
            f'load average {os.getloadavg()[0]:.2f} (2 cores shared)')
        warm = run(common + ['--out', str(folder / 'warm')])
        log(f'untimed warm-up (builds the caches): {warm:.1f} s')
        serial = run(common + ['--out', str(folder / 'serial')])
        log(f'serial: {serial:.1f} s wall; cells (s): {described(cell_seconds(folder / "serial"))}; load average '
            f'{os.getloadavg()[0]:.2f}')
        started = time.perf_counter()
        node = {'num_cpus': 1, 'object_store_memory': 200 * 2 ** 20}
        cluster = Cluster(initialize_head=True, head_node_args={**node, 'include_dashboard': False})
        try:
            for _ in range(NODES - 1):
                cluster.add_node(**node)
            cluster.wait_for_nodes()
            up = time.perf_counter() - started
            parallel = run(common + ['--out', str(folder / 'cluster'), '--cells', str(NODES), '--ray-address',
                                     cluster.address])
            load = os.getloadavg()[0]
        finally:
            ray.shutdown()
            cluster.shutdown()
        cells = cell_seconds(folder / 'cluster')
        rounds = math.ceil(len(cells) / NODES)
        slowest = sorted((total for total, _ in cells.values()), reverse=True)
        bound = sum(slowest[i * NODES] for i in range(rounds))  # each round of NODES cells lasts its slowest
        log(f'cluster ({NODES} nodes x 1 CPU, --cells {NODES}): {parallel:.1f} s wall after {up:.1f} s to start the '
            f'cluster; cells (s): {described(cells)}; load average {load:.2f}')
        log(f'overhead of the cluster run over its rounds of slowest cells ({rounds} rounds: {bound:.1f} s): '
            f'{parallel - bound:.1f} s (connecting, worker processes, imports, shipping results, combined outputs)')
        got, want = outputs(folder / 'cluster'), outputs(folder / 'serial')
        differ = sorted(name for name in set(got) | set(want) if got.get(name) != want.get(name))
        log(f'outputs equal to the serial grid: {not differ} ({len(want)} files'
            + (f'; differ: {", ".join(differ)})' if differ else ')'))
        log(f'speed-up {serial / parallel:.2f}x wall ({serial / (parallel + up):.2f}x counting the cluster start); '
            "this machine's 2 cores bound it: the three nodes share them")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
