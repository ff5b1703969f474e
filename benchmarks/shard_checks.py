#!/usr/bin/env python
"""What ShardedPrunedRetriever's own checks cost at MS MARCO v1 passage scale (8.8M docnos), on the driver and on each
shard's node, without a cluster: the functions the actors and the driver run, timed here.

1. refusing docnos shared by two shards, at its start: each shard hashes its docnos (``shard_data.docno_hashes``) and
   sorts them (on its own node, the shards at once); the driver merges the sorted hashes (``shard_data.shared_hashes``).
   Beside it, what the alternative costs: a Python set of every docno on the driver (time and peak memory);
2. the plan of each call, decided once on the driver for the whole collection (``planner.choose``, the model
   calibrated on this machine: a few seconds on first use, then cached), for batches of 1, 8 and 64 pruned queries
   (~35 % kept); and how often a shard of 1/2, 1/4 or 1/8 of the collection would have planned the batch otherwise on
   its own (which it did before the plan moved to the driver): the path its scores would have taken.

Usage (from the repository root)::

    python benchmarks/run.py shard_checks                  # 8,841,823 docnos, 1, 2 and 4 shards
    python benchmarks/run.py shard_checks --docs 1000000
"""
import argparse
import os
import resource
import time

import numpy as np
from common import log  # before the package: it sets the environment (offline hub, temporary homes)

from pyterrier_rdime.pruned import calibration, kept, planner, shard_data

#: MS MARCO v1 passage.
MSMARCO_PASSAGES = 8_841_823


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--docs', type=int, default=MSMARCO_PASSAGES)
    parser.add_argument('--dims', type=int, default=768, help='dimensions of the collection the plan is for')
    args = parser.parse_args(argv)
    log(f'# shard_checks: {args.docs:,} docnos; load average {os.getloadavg()[0]:.2f} (2 cores shared)')
    docnos = np.array([str(i) for i in range(args.docs)], dtype=object)  # MS MARCO's docnos are its row numbers
    for shards in (1, 2, 4):
        parts = np.array_split(np.arange(args.docs), shards)
        start = time.perf_counter()
        hashes = [np.sort(shard_data.docno_hashes(lambda ids, part=part: docnos[part[ids]], len(part)))
                  for part in parts]
        per_shard = (time.perf_counter() - start) / shards
        start = time.perf_counter()
        shared = shard_data.shared_hashes(hashes)
        merge = time.perf_counter() - start
        log(f'{shards} shard(s): hash + sort {per_shard:.2f} s per shard (on its node, the shards at once); '
            f'merge on the driver {merge:.2f} s, {sum(h.nbytes for h in hashes) / 2 ** 20:.0f} MiB of hashes '
            f'received; {len(shared)} shared')
    before = peak_mib()
    start = time.perf_counter()
    everyone = set(docnos.tolist())
    log(f'alternative, a set of every docno on the driver: {time.perf_counter() - start:.2f} s, peak memory '
        f'+{peak_mib() - before:.0f} MiB ({len(everyone):,} docnos; the docnos sent there too)')
    del everyone
    model = calibration.model()
    rng = np.random.default_rng(0)

    def plan(query_vecs: np.ndarray, docs: int):
        return planner.choose(query_vecs, strategy='auto', matrix_bytes=docs * args.dims * 4,
                              compiled=kept.NUMBA_AVAILABLE, model=lambda: model, k=1000).plan
    for queries in (1, 8, 64):
        batches = [np.where(rng.random((queries, args.dims)) < rng.uniform(0.05, 0.95),
                            rng.standard_normal((queries, args.dims)), 0).astype(np.float32) for _ in range(200)]
        start = time.perf_counter()
        whole = [plan(batch, args.docs) for batch in batches]
        seconds = (time.perf_counter() - start) / len(batches)
        other = {shards: sum(plan(batch, args.docs // shards) != p for batch, p in zip(batches, whole))
                 for shards in (2, 4, 8)}
        paths = ', '.join(f'{path} {sum(p.path == path for p in whole)}' for path in sorted({p.path for p in whole}))
        log(f'plan of {queries} queries on the driver: {seconds * 1e6:.0f} us; of {len(batches)} batches (5-95 % '
            f'kept): {paths}; planned otherwise by a shard of 1/2, 1/4, 1/8 of the collection: '
            f'{", ".join(str(n) for n in other.values())}')
    return 0


if __name__ == '__main__':
    import sys
    sys.exit(main())
