#!/usr/bin/env python
"""Runs the benchmarks: ``python benchmarks/run.py [all|NAME] [options of that one]``.

One script per question, each printing ratios measured side by side in one run:

- ``overhead``: what RDIME adds to a re-ranking pipeline on the DL19 pool;
- ``estimators``: queries/s of the vectorised DIME + RDIME stages against a per-query loop;
- ``search``: exact retrieval scoring only the kept dimensions (PrunedRetriever) against every dimension;
- ``auto``: whether ``strategy='auto'`` takes the fastest path in every row of ``search``, and what its measuring
  (exploring) costs;
- ``layout``: time and memory to build the on-disk dimension-major layout, projected to MS MARCO;
- ``batches``: ways of scoring a batch of pruned queries (tile and cache sizes, one by one, grouping);
- ``pipelines``: per-query latency of the retrieve-mode pipelines end to end (encoder, BM25, feedback, pruning);
- ``switch``: what one query pays for the threads of the call before it (right after the other path, back to back,
  after a pause);
- ``shards``: ShardedPrunedRetriever over 1, 2 and 4 shards on a local multi-node Ray cluster against one
  PrunedRetriever, its scatter/gather overhead, and the cost of 100M x 768 over N nodes on paper (the first run also
  writes the 2- and 4-shard copies of the 1M index and their layouts, 11.4 GiB of disk, ~2 min);
- ``shard_checks``: what ShardedPrunedRetriever's refusal of docnos shared by two shards and its plan on the driver
  cost at 8.8M docnos (seconds, no cluster);
- ``node_loss``: ShardedPrunedRetriever when the node of a pinned shard is lost, on a ``ray start`` cluster on this
  machine: the error without a replacement node, the same ranking with one (~1.5 min);
- ``grid_cluster``: a 4-cell grid (the four shared collections x MiniLM, 20 queries each) with ``--cells 3`` on a
  local 3-node Ray cluster against the same grid serially: both wall times, the overhead, equal outputs (~1.5 min
  once its caches exist; the first run builds them, 11-13 min on the shared 2-core machine);
- ``scale``: the paper's protocol at MS MARCO's scale (8.8M passages): a FlexIndex of the DL19 pool among synthetic
  distractors, the runner's whole retrieve-mode cell over it, its time, memory, disk, paths, exactness and the
  effectiveness/latency frontier (not in ``all``: ~27 GB of disk and an hour or more; ``--docs 1000000`` for less);
- ``four_bit``: a 4-bit first pass before the int8 copy's re-check and the exact re-score, stage by stage, against
  the int8 compressed path and the dense path (one query and a batch in one pass; the measurement behind speed.rst's
  "A 4-bit first pass: measured, not kept"; not in ``all``: ~8 min and a 366 MiB cached copy);
- ``bounds``: how much of the kept rows an exact kernel that stops a block of documents early by a bound on the
  remaining dimensions could skip, at best (a count with an oracle threshold, not a timing).

``all`` (the default, ``./run.sh benchmark``) runs them all with their defaults (~40 min on a shared 2-core machine
once the caches exist, ~13 of them for ``bounds``; the first run also builds a 1M x 768 synthetic index and its
layout, ~2 min, and encodes the DL19 pool, ~2.5 min).
"""
import sys

import auto
import batches
import bounds
import estimators
import four_bit
import grid_cluster
import layout
import node_loss
import overhead
import pipelines
import scale
import search
import shard_checks
import shards
import switch

SCRIPTS = {'overhead': overhead, 'estimators': estimators, 'search': search, 'auto': auto, 'layout': layout,
           'pipelines': pipelines, 'batches': batches, 'switch': switch, 'shards': shards,
           'shard_checks': shard_checks, 'node_loss': node_loss, 'grid_cluster': grid_cluster, 'bounds': bounds,
           'scale': scale, 'four_bit': four_bit}


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
    for script in (s for name, s in SCRIPTS.items() if name not in ('scale', 'four_bit')):
        script.main(['--docs', '1000000'] if script is layout else [])
        print(flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
