#!/usr/bin/env python
"""What does serving a pruned index from shards on a Ray cluster cost, and what would 100M x 768 cost over N nodes?

One ``PrunedRetriever`` over a seeded synthetic FlexIndex (``search.py``'s, default 1M x 768) against
``ShardedPrunedRetriever`` over the same index cut by ``split_flex_index`` into 1, 2 and 4 shards, each shard on its
own node of a real multi-node Ray cluster started on this machine (``ray.cluster_utils.Cluster``: a head node and one
node per shard, each its own raylet and object store; the shard goes to its node by a custom resource). Queries:
PRF DIME (M = 2) from the exact top-10, then RDIME (~35 % kept); top-100; ``strategy='auto'`` on every side.

1. latency and throughput: one query per call, and batches of 8 and 64; min and median over rounds, timed in
   interleaved rounds (every side once per round, the order rotating); the min (the least disturbed round, as in
   the other benchmarks) feeds sections 2 and 4;
2. the scatter/gather overhead: the 1-shard call against the same search timed inside its actor (what Ray's round
   trip, the transfer of the queries and of the shard's top-k, and the merge add), per batch and per query, beside
   its parts: an empty round trip to every actor, and the merge alone;
3. exactness: the sharded top-100 against the single one;
4. on paper: the cost per query of a 100M x 768 index over N nodes, dense against pruned, from the bytes per second
   one node streamed here on each path and the measured overhead.

On a machine with few cores, the shards of one run share them: the per-node rates, not the N-shard latencies, are
what carries over to a real cluster. Every run prints its load average.

Usage (from the repository root)::

    python benchmarks/run.py shards                     # 1M x 768 (writes the shards: 3 x 2.9 GiB of disk)
    python benchmarks/run.py shards --docs 200000       # ~3 min
    python benchmarks/run.py shards --shards 1,2 --rounds 3 --json out.json
"""
import argparse
import os
import sys
import time

import common  # first: it sets the environment (offline hub, temporary PyTerrier homes)
import numpy as np
import pandas as pd
from common import interleaved, log, table, timed
from search import K, make_queries, pruned_query_sets

from pyterrier_rdime import PrunedRetriever, ShardedPrunedRetriever, split_flex_index
from pyterrier_rdime.pruned import kept, sharded

#: The index the projection is for (MS MARCO v2.1 segmented is ~113M passages).
PROJECTED_DOCS = 100_000_000


def shard_index(index, cache, shards: int) -> list:
    """The index cut into ``shards`` shards, cached beside it (one shard: the index itself, sharing its layout with
    the single retriever)."""
    if shards == 1:
        return [index]
    folder = cache / f'{index.index_path.name}-shards{shards}'
    paths = [folder / f'shard-{i}-of-{shards}.flex' for i in range(shards)]
    if all((p / 'pt_meta.json').is_file() for p in paths):
        return [type(index)(str(p), verbose=False) for p in paths]
    return split_flex_index(index, folder, shards)


def start_cluster(nodes: int, cpus: int):
    """A head node (the driver's, no CPU to place actors on) and ``nodes`` nodes of ``cpus`` logical CPUs offering
    ``node<i>`` each (a tenth per actor: node ``i`` serves shard ``i`` of every shard count, one count at a time)."""
    import ray
    from ray.cluster_utils import Cluster
    os.environ.setdefault('RAY_USAGE_STATS_ENABLED', '0')
    cluster = Cluster(initialize_head=True, head_node_args={'num_cpus': 0, 'include_dashboard': False,
                                                            'object_store_memory': 256 * 2 ** 20})
    for i in range(nodes):
        cluster.add_node(num_cpus=cpus, resources={f'node{i}': 1}, object_store_memory=256 * 2 ** 20)
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    return ray, cluster


def stats(times) -> dict:
    return {'min': float(np.min(times)), 'median': float(np.median(times))}


def ms(seconds: float) -> str:
    return f'{seconds * 1000:.1f} ms'


def same_topk(a: pd.DataFrame, b: pd.DataFrame) -> str:
    """'identical', 'ties' (the same scores, documents swapped among equal scores) or 'MISMATCH'."""
    if a['docid'].tolist() == b['docid'].tolist() and np.allclose(a['score'], b['score'], rtol=1e-6, atol=1e-6):
        return 'identical'
    if np.allclose(a['score'], b['score'], rtol=1e-6, atol=1e-6):
        return 'ties'
    return 'MISMATCH'


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    common.synthetic_index_options(parser)
    parser.add_argument('--shards', default='1,2,4', help='comma-separated shard counts (1 among them)')
    parser.add_argument('--batches', default='1,8,64', help='comma-separated batch sizes')
    parser.add_argument('--single', type=int, default=8, help='queries timed one at a time (per round)')
    parser.add_argument('--rounds', type=int, default=5)
    args = parser.parse_args(argv)
    counts = [int(s) for s in args.shards.split(',')]
    batch_sizes = [int(b) for b in args.batches.split(',')]
    if 1 not in batch_sizes or 1 not in counts:
        parser.error('--batches and --shards must include 1 (the single-query rate and the 1-shard overhead the '
                     'projection starts from)')
    info = common.machine()
    limiter = common.set_threads(args.threads)
    log(f'## Sharded pruned search on a local Ray cluster: top-{K} over {args.docs:,} x {args.dims} float32\n')
    log(common.describe_machine(info, args.threads) + f'; compiled kernel: {kept.NUMBA_AVAILABLE}')
    args.cache.mkdir(parents=True, exist_ok=True)
    gen_s, (index, state) = timed(lambda: common.synthetic_flex_index(args.cache, args.docs, args.dims))
    single = PrunedRetriever(index=index, num_results=K)
    dense = PrunedRetriever(index=index, num_results=K, strategy='dense')
    matrix = single.dim_major()
    raw = make_queries(state, max(batch_sizes + [args.single]))
    queries = pruned_query_sets(index, matrix, raw, ())['RDIME']
    frame = pd.DataFrame({'qid': [f'q{i}' for i in range(len(queries))], 'query': 'text', 'query_vec': list(queries)})
    kept_frac = float(np.mean(queries != 0))
    split_s, splits = timed(lambda: {n: shard_index(index, args.cache, n) for n in counts})
    log(f'index ready in {gen_s:.0f} s, shards in {split_s:.0f} s; RDIME keeps {kept_frac:.2f} of the dimensions')

    start_s, (ray, cluster) = timed(lambda: start_cluster(max(counts), args.threads * len(counts)))
    log(f'Ray cluster: a head node and {max(counts)} nodes, started in {start_s:.1f} s')
    retrievers = {}
    for n in counts:
        # each shard on its own node, on an equal share of this machine's cores
        threads = max(1, args.threads // n)
        retrievers[n] = ShardedPrunedRetriever(shards=splits[n], num_results=K, num_cpus=threads,
                                               resources=[{f'node{i}': 0.1} for i in range(n)])
        up_s = timed(lambda: retrievers[n](frame.iloc[:2]))[0]
        log(f'{n} shard(s), {threads} thread(s) each: actors started, layouts opened (built on first use) and the '
            f"first batch served in {up_s:.1f} s")
    single(frame.iloc[:2])
    dense(frame.iloc[:2])

    log('\n### 1. Latency and throughput\n')
    rows, results = [], {'kept': kept_frac, 'sides': {}}
    for b in batch_sizes:
        calls = [frame.iloc[i:i + 1] for i in range(args.single)] if b == 1 else [frame.iloc[:b]]
        sides = {'single, dense': dense, 'single': single, **{f'{n} shard(s)': retrievers[n] for n in counts}}
        times = interleaved({name: (lambda r=r: [r(c) for c in calls]) for name, r in sides.items()}, args.rounds)
        per_call = {name: np.asarray(t) / len(calls) for name, t in times.items()}
        for name, t in per_call.items():
            s = stats(t)
            results['sides'][f'{name}, batch {b}'] = s
            rows.append([b, name, ms(s['min']), ms(s['median']), f'{b / s["median"]:.1f}'])
    log(f'one call per side per round ({args.rounds} rounds, order rotating); batch 1 = {args.single} single-query '
        'calls per round, per call shown; throughput = queries / median call\n')
    log(table(rows, ['batch', 'side', 'min', 'median', 'queries/s']))

    log('\n### 2. Scatter / gather overhead\n')
    handles = retrievers[max(counts)]._actors.handles
    noop = interleaved({'round trip': lambda: ray.get([h.__ray_call__.remote(lambda server: None) for h in handles])},
                       args.rounds * 4)['round trip']

    def in_actor(server, batch, plan):  # defined here: Ray ships it by value to the actor
        start = time.perf_counter()
        server.search(batch, K, plan)
        return time.perf_counter() - start

    one_shard = retrievers[1]._actors.handles[0]
    rows, overhead = [], {}
    for b in batch_sizes:
        one, base = results['sides'][f'1 shard(s), batch {b}'], results['sides'][f'single, batch {b}']
        parts = [queries[i:i + 1] for i in range(args.single)] if b == 1 else [queries[:b]]
        # the same search, on the plan the stage decides on the driver, timed inside the 1-shard actor: what the
        # stage's call adds to it is the overhead
        batches = [(ray.put(part), retrievers[1].plan(part)) for part in parts]
        compute = min(sum(ray.get([one_shard.__ray_call__.remote(in_actor, ref, plan) for ref, plan in batches]))
                      for _ in range(args.rounds)) / len(batches)
        extra = one['min'] - compute
        _, _, found, scores, docids, docnos = ray.get(handles[0].search.remote(
            ray.put(queries[:b]), K, retrievers[max(counts)].plan(queries[:b])))
        bounds = np.concatenate([[0], np.cumsum(found)])
        parts = [(bounds, scores, docids, docnos)] * max(counts)
        merge = min(timed(lambda: sharded.merge_shards(parts, b, K))[0] for _ in range(5))
        overhead[b] = {'per_batch': extra, 'per_query': extra / b, 'in_actor': compute, 'merge': merge}
        rows.append([b, ms(base['min']), ms(compute), ms(one['min']), ms(extra), ms(extra / b),
                     ms(merge) + f' ({max(counts)} shards)'])
    log(f'least disturbed rounds: the single retriever in this process, the same search timed inside the 1-shard '
        f'actor ({args.threads} threads, the same layout file), and the 1-shard stage call; overhead = the call - the '
        f'search inside the actor. An empty round trip to {len(handles)} actors: min {ms(min(noop))}, median '
        f'{ms(float(np.median(noop)))}\n')
    log(table(rows, ['batch', 'single', 'search in the actor', '1-shard call', 'overhead / batch', 'overhead / query',
                     'merge alone']))
    results['overhead'] = overhead
    results['round_trip'] = stats(noop)

    log('\n### 3. Exactness\n')
    reference = single(frame)
    checks = {}
    for n in counts:
        out = retrievers[n](frame)
        status = [same_topk(out[out['qid'] == q], reference[reference['qid'] == q]) for q in frame['qid']]
        checks[n] = {s: status.count(s) for s in ('identical', 'ties', 'MISMATCH')}
        log(f'{n} shard(s): top-{K} of {len(status)} queries against the single retriever: {checks[n]}')
    results['exactness'] = checks

    log(f'\n### 4. On paper: {PROJECTED_DOCS // 10 ** 6}M x {args.dims} over N nodes\n')
    batch = max(batch_sizes)
    sides = (('dense', 'single, dense'), ('pruned', 'single'))
    # bytes each path reads per second: the whole matrix (dense), the kept rows (pruned); for a batch, index bytes
    # served per second (matrix x queries / time)
    read = {'dense': matrix.nbytes, 'pruned': matrix.nbytes * kept_frac}
    rate = {path: read[path] / results['sides'][f'{side}, batch 1']['min'] for path, side in sides}
    batch_rate = {path: matrix.nbytes * batch / results['sides'][f'{side}, batch {batch}']['min']
                  for path, side in sides}
    total = PROJECTED_DOCS * args.dims * 4
    rows = []
    for nodes in (1, 8, 32, 128):
        per_node = total / nodes
        # the merge grows with the shards (k results from each); the round trip is paid in parallel
        merge = {b: overhead[b]['merge'] * nodes / max(counts) for b in (1, batch)}
        one = {path: per_node * (kept_frac if path == 'pruned' else 1) / rate[path] + overhead[1]['per_batch']
               + merge[1] for path in rate}
        per_query = {path: per_node / batch_rate[path] + overhead[batch]['per_query'] + merge[batch] / batch
                     for path in rate}
        rows.append([nodes, f'{per_node / 2 ** 30:.0f} GiB', ms(one['dense']), ms(one['pruned']),
                     f'{one["dense"] / one["pruned"]:.2f}×', ms(per_query['dense']), ms(per_query['pruned']),
                     f'{per_query["dense"] / per_query["pruned"]:.2f}×'])
    log(f'one node (this machine, {args.threads} thread(s)) streams {rate["dense"] / 2 ** 30:.1f} GiB/s of the index '
        f'on the dense path and {rate["pruned"] / 2 ** 30:.1f} GiB/s of its kept rows on the pruned path (auto\'s '
        f'choice), one query at a time ({matrix.nbytes / 2 ** 30:.2f} GiB, x {kept_frac:.2f} kept, / the least '
        f'disturbed latency); in batches of {batch}, {batch_rate["dense"] / 2 ** 30:.1f} and '
        f'{batch_rate["pruned"] / 2 ** 30:.1f} GiB/s of index served. Cost = the bytes each node reads / its rate + '
        f'the overhead of section 2 (1 shard) + the merge scaled from {max(counts)} shards to N; every node scans '
        'its shard at once and holds it in memory.\n')
    log(table(rows, ['nodes', 'index per node', 'one query: dense', 'pruned', 'speed-up',
                     f'per query in batches of {batch}: dense', 'pruned', 'speed-up']))
    results['projection'] = {'bytes_per_s': rate, 'batch_bytes_per_s': batch_rate}

    log(f'\nload average at end: {", ".join(f"{x:.1f}" for x in os.getloadavg())}; {time.strftime("%Y-%m-%d %H:%M")}')
    ray.shutdown()
    cluster.shutdown()
    limiter.unregister()
    if args.json:
        common.write_json(args.json, info, args, results)
    return 0


if __name__ == '__main__':
    sys.exit(main())
