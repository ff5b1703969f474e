#!/usr/bin/env python
"""Which way of scoring a batch of pruned queries is fastest?

A batch of RDIME-pruned queries over the synthetic index of ``search`` (default 1M x 768), top-100, against the
dense path (one matrix product per batch with the top-k): the compiled kernel in one pass with the shipped tile and
cache sizes, with other tile sizes (dimensions per tile) and cache budgets (floats of scores + tile per block), one
query after the other, queries grouped by kept-set overlap (each group scored in one pass), and the compressed path
(the int8 copy) query after query and in one pass (integer scores of the whole batch from one int8 matrix product
per slab of documents, torch's where installed). Measured in blocks; min over rounds and the median of the
per-round ratios.

Usage (from the repository root)::

    python benchmarks/run.py batches --batch 64
"""
import argparse
import sys

import common  # first: it sets the environment (offline hub, temporary PyTerrier homes)
import numpy as np
from common import fmt_ratio, log, ratio_stats, table

from pyterrier_rdime import PrunedRetriever
from pyterrier_rdime.pruned import _numba, compressed, dense

K = 100


def with_sizes(tile: int, cache_floats: int):
    """The kernel in one pass with these tile and cache sizes."""
    def run(matrix, queries):
        saved = _numba.TILE_DIMS, _numba.BATCH_CACHE_FLOATS
        _numba.TILE_DIMS, _numba.BATCH_CACHE_FLOATS = tile, cache_floats
        try:
            return _numba.fused_top_k(matrix, queries, K, one_pass=True)
        finally:
            _numba.TILE_DIMS, _numba.BATCH_CACHE_FLOATS = saved
    return run


def grouped(groups: int):
    """Queries clustered by their kept sets (k-means on the 0/1 masks, a few iterations), each group in one pass:
    fewer distinct rows per pass when the kept sets of a group overlap."""
    def run(matrix, queries):
        masks = (queries != 0).astype(np.float32)
        rng = np.random.default_rng(0)
        centres = masks[rng.choice(len(masks), groups, replace=False)]
        for _ in range(5):
            label = np.argmax(masks @ centres.T - 0.5 * (centres ** 2).sum(axis=1), axis=1)
            centres = np.stack([masks[label == g].mean(axis=0) if (label == g).any() else centres[g]
                                for g in range(groups)])
        scores, docids = [None] * len(queries), [None] * len(queries)
        for g in range(groups):
            members = np.flatnonzero(label == g)
            if len(members):
                s, d = _numba.fused_top_k(matrix, queries[members], K, one_pass=True)
                for m, s_m, d_m in zip(members, s, d):
                    scores[m], docids[m] = s_m, d_m
        return scores, docids
    return run


def main(argv=None) -> int:
    from search import check_topk, make_queries, pruned_query_sets
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    common.synthetic_index_options(parser)
    parser.add_argument('--batch', type=int, default=64)
    parser.add_argument('--rounds', type=int, default=4)
    parser.add_argument('--per-block', type=int, default=2)
    args = parser.parse_args(argv)
    title = f'## Batch strategies: {args.batch} RDIME queries, top-{K} over {args.docs:,} x {args.dims}\n'
    with common.session(args, args.threads, title) as run:
        index, state = common.synthetic_flex_index(args.cache, args.docs, args.dims)
        matrix = PrunedRetriever(index=index).dim_major()
        queries = pruned_query_sets(index, matrix, make_queries(state, args.batch), ())['RDIME']
        shipped = (_numba.TILE_DIMS, _numba.BATCH_CACHE_FLOATS)
        variants = {f'one pass, tile {shipped[0]}, cache {shipped[1] * 4 // 1024} KiB (shipped)': with_sizes(*shipped)}
        for tile, floats in ((16, shipped[1]), (64, shipped[1]), (shipped[0], shipped[1] // 2),
                             (shipped[0], shipped[1] * 2)):
            variants[f'one pass, tile {tile}, cache {floats * 4 // 1024} KiB'] = with_sizes(tile, floats)
        variants['one query after the other'] = lambda m, q: _numba.fused_top_k(m, q, K, one_pass=False)
        for groups in (4, 8):
            variants[f'{groups} groups by kept-set overlap'] = grouped(groups)
        retriever = PrunedRetriever(index=index)
        copy, rows = retriever._layout.codes(), retriever._layout.doc_rows()
        variants['compressed, query after query'] = \
            lambda m, q: compressed.search_compressed(copy, m, q, K, use_numba=True, doc_rows=rows)
        variants[f'compressed, one pass ({compressed.INT8_PRODUCT} int8 product)'] = \
            lambda m, q: compressed.search_compressed(copy, m, q, K, use_numba=True, one_pass=True, doc_rows=rows)
        ref_s, ref_i = dense.search_dense(matrix, queries, K)
        for name, fn in variants.items():  # the dense path's top-k up to float ties, and compiled before timing
            got_s, got_i = fn(matrix, queries)
            status = [check_topk(matrix, q, (ref_s[i], ref_i[i]), (got_s[i], got_i[i]), 1e-5 * float(np.abs(q).sum()))
                      for i, q in enumerate(queries)]
            if 'MISMATCH' in status:
                raise AssertionError(f'{name}: top-{K} of query {status.index("MISMATCH")} differs from the dense path')
        times = common.blocks({'dense': lambda: dense.search_dense(matrix, queries, K, batch_size=args.batch),
                               **{n: (lambda f=f: f(matrix, queries)) for n, f in variants.items()}},
                              args.rounds, args.per_block)
        rows = [[name, f'{np.min(times[name]) * 1000:.0f} ms', fmt_ratio(ratio_stats(times['dense'], times[name]))]
                for name in variants]
        log(f'kept {np.mean(queries != 0):.2f}, union {np.mean((queries != 0).any(axis=0)):.2f}; dense (one matrix '
            f'product + top-k): {np.min(times["dense"]) * 1000:.0f} ms\n')
        log(table(rows, ['strategy', 'time', 'speed-up vs dense']))
        run['results'].update({n: list(t) for n, t in times.items()})
    return 0


if __name__ == '__main__':
    sys.exit(main())
