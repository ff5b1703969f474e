#!/usr/bin/env python
"""Runs the benchmarks: ``python benchmarks/run.py [all|NAME] [options of that one]``.

One script per question, each printing ratios measured side by side in one run:

- ``search``: exact retrieval scoring only the kept dimensions (PrunedRetriever) against every dimension;
- ``auto``: whether ``strategy='auto'`` takes the fastest path in every row of ``search``, and what its measuring
  (exploring) costs;
- ``batches``: ways of scoring a batch of pruned queries (tile and cache sizes, one by one, grouping);
- ``pipelines``: per-query latency of the retrieve-mode pipelines end to end (encoder, BM25, feedback, pruning);
- ``shards``: ShardedPrunedRetriever over 1, 2 and 4 shards on a local multi-node Ray cluster against one
  PrunedRetriever, its scatter/gather overhead, and the cost of 100M x 768 over N nodes on paper (the first run also
  writes the 2- and 4-shard copies of the 1M index and their layouts, 11.4 GiB of disk, ~2 min);
- ``grid_cluster``: a 4-cell grid (the four shared collections x MiniLM, 20 queries each) with ``--cells 3`` on a
  local 3-node Ray cluster against the same grid serially: both wall times, the overhead, equal outputs (~1.5 min
  once its caches exist; the first run builds them, 11-13 min on the shared 2-core machine);
- ``scale``: the paper's protocol at MS MARCO's scale (8.8M passages): a FlexIndex of the DL19 pool among synthetic
  distractors, the runner's whole retrieve-mode cell over it, its time, memory, disk, paths, exactness and the
  effectiveness/latency frontier (not in ``all``: ~27 GB of disk and an hour or more; ``--docs 1000000`` for less).

The studies whose conclusions pt_docs/speed.rst records (four_bit, bounds, switch, shard_checks, node_loss, layout,
overhead, estimators) left the tree; "Studies out of the tree" in speed.rst names the commit that has them.

``all`` (the default, ``./run.sh benchmark``) runs every one but ``scale`` with its defaults (the first run also
builds a 1M x 768 synthetic index and its layout, ~2 min, and encodes the DL19 pool, ~2.5 min).
"""
import sys

import auto
import batches
import grid_cluster
import pipelines
import scale
import search
import shards

SCRIPTS = {'search': search, 'auto': auto, 'pipelines': pipelines, 'batches': batches, 'shards': shards,
           'grid_cluster': grid_cluster, 'scale': scale}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    name = argv[0] if argv and not argv[0].startswith('-') else 'all'
    rest = argv[1:] if argv and name == argv[0] else argv
    if name in ('-h', '--help') or (name != 'all' and name not in SCRIPTS):
        print(__doc__, file=sys.stderr)
        return 0 if name in ('-h', '--help') else 2
    if name != 'all':
        return SCRIPTS[name].main(rest)
    if rest:
        print('run.py all takes no options; run one benchmark to pass options to it', file=sys.stderr)
        return 2
    for script in (s for name, s in SCRIPTS.items() if name != 'scale'):
        script.main([])
        print(flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
