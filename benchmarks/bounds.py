#!/usr/bin/env python
"""Could exact pruned search stop scoring a block of documents once a bound shows that it cannot reach the top-k?

Counts, it does not time: for RDIME-pruned queries (and Top-k 0.50) over the synthetic index of ``search`` (top-100),
the share of the kept rows' bytes (kept dimensions x documents) that an exact early-terminating kernel would still
have to read, at best. The kept dimensions are read in order of decreasing ``|q_j| * M_j``; after each one, a
document's score is bounded by its partial score plus a bound on what the dimensions not yet read can add, and a
block of ``B`` documents stops once the bound of every one of its documents is below the threshold (the
document-level variant counts each document's own stopping point: a kernel that drops documents one by one). Inner
products are not monotone, unlike PDX-BOND's L2 distances (arXiv 2503.04422), hence the bound on the rest:

- global M: ``sum |q_j| * M_j`` over the dimensions left, ``M_j`` the largest ``|d_j|`` of the index (what
  ``Layout.abs_max()`` records);
- block M: the same with ``M_j`` the largest ``|d_j|`` of the block, the dimensions ordered per block;
- Cauchy-Schwarz: ``||q_rest|| * ||d_rest||`` with each document's exact norm over the kept dimensions left (an
  oracle too: those norms depend on the query's kept set and order, a kernel could not store them).

Every bound falls as dimensions are read (each step adds ``q_j d_j <= |q_j| M_j``), so a document's stopping point is
the number of steps at which its bound still reaches the threshold, and a block's is the largest of its documents'.
The threshold is an oracle: each query's exact 100th best score (lowered by 1e-6 for float32 rounding), where a real
kernel only knows a running k-th score below it; the shares are therefore lower limits of what a kernel reads
(``--rank 1000`` takes the 1000th score instead: about the running k-th after a tenth of the documents).
Documents in index order (random topics per block) and grouped by the generator's topic (~100 documents per topic,
a block holds whole topics, as an IVF-clustered layout would).

Usage (from the repository root)::

    python benchmarks/run.py bounds --threads 1                # 16 queries, 3 of 15 chunks of 65,536 documents
    python benchmarks/run.py bounds --threads 1 --chunks 15    # every full chunk (~5x longer)
    python benchmarks/run.py bounds --threads 1 --rank 1000    # a threshold that a kernel knows partway through
"""
import argparse
import sys
from typing import Dict, Sequence

import common  # first: it sets the environment (offline hub, temporary PyTerrier homes)
import numpy as np
from common import log, table

from pyterrier_rdime.pruned import layout

K = 100
#: 16 and 64: one cache line of float32 and of int8 values, the finest a dimension-major kernel can skip; 16384: the
#: block of the compiled kernel.
BLOCK_SIZES = (16, 64, 256, 1024, 4096, 16384)
CHUNK = 65536  # documents scored together: a multiple of every block size
BOUNDS = ('global M', 'block M', 'Cauchy-Schwarz')
ROUNDING = 1e-6  # the threshold is lowered by this much: float32 scores against float64 partial sums


def remaining_bound(bound: np.ndarray) -> np.ndarray:
    """``(dims, ...)`` per-dimension bounds in reading order -> ``(dims + 1, ...)``: row ``t`` bounds what the
    dimensions after the first ``t`` can add (the sum of ``bound[t:]``; the last row is 0)."""
    suffix = np.zeros((len(bound) + 1,) + bound.shape[1:])
    for t in range(len(bound) - 1, -1, -1):  # row by row: numpy's cumsum along the first axis is several times slower
        suffix[t] = suffix[t + 1] + bound[t]
    return suffix


def dims_read(contributions: np.ndarray, remaining: np.ndarray, threshold: float) -> np.ndarray:
    """How many dimensions each document needs before its upper bound falls below ``threshold``.

    Args:
        contributions: ``(dims, ...)`` the terms ``q_j * d_j`` in reading order.
        remaining: ``(dims + 1, ...)`` (broadcast against ``contributions``) the bound on the dimensions not yet read,
            before any is read (row 0) and after each.
        threshold: the score a document must reach to enter the top-k.

    Returns:
        ``(...)`` int: the number of leading dimensions read (every one when the bound never falls below the
        threshold, as for a document of the top-k). Relies on the bound falling as dimensions are read.
    """
    dims, shape = len(contributions), np.broadcast_shapes(contributions.shape[1:], remaining.shape[1:])
    partial = np.zeros(shape)
    count = np.zeros(shape, dtype=np.int64)
    count += remaining[0] >= threshold
    for t in range(dims):  # the steps at which the bound still reaches the threshold
        partial += contributions[t]
        count += partial + remaining[t + 1] >= threshold
    return np.minimum(count, dims)


def block_dims_read(per_document: np.ndarray, block: int) -> np.ndarray:
    """A block stops when its last document does: the largest count of each block of ``block`` documents."""
    return per_document.reshape(-1, block).max(axis=1)


def stopping_points(rows: np.ndarray, query: np.ndarray, abs_max: np.ndarray, threshold: float,
                    block_sizes: Sequence[int]) -> Dict[str, np.ndarray]:
    """Each document's count of dimensions read under each bound.

    Args:
        rows: ``(dims, docs)`` float64 the documents' kept dimensions, in decreasing order of ``|q_j| * M_j``.
        query: ``(dims,)`` the query's kept weights in the same order.
        abs_max: ``(dims,)`` the index's largest ``|d_j|`` in the same order.
        threshold: the k-th best score.
        block_sizes: the blocks of the block-M bound (its bound and order depend on the block).

    Returns:
        variant -> ``(docs,)`` counts: ``'global M'``, ``'Cauchy-Schwarz'``, and ``'block M/B'`` for each block size.
    """
    weight = np.abs(query)
    contributions = query[:, None] * rows
    found = {'global M': dims_read(contributions, remaining_bound(weight * abs_max)[:, None], threshold)}
    query_rest = np.sqrt(remaining_bound(query ** 2))[:, None]
    found['Cauchy-Schwarz'] = dims_read(contributions, query_rest * np.sqrt(remaining_bound(rows ** 2)), threshold)
    dims, docs = rows.shape
    for size in block_sizes:
        blocked = rows.reshape(dims, docs // size, size)
        block_weight = weight[:, None] * np.abs(blocked).max(axis=2)  # (dims, blocks)
        order = np.argsort(-block_weight, axis=0, kind='stable')
        ordered = np.take_along_axis(blocked, order[:, :, None], axis=0) * query[order][:, :, None]
        bound = remaining_bound(np.take_along_axis(block_weight, order, axis=0))[:, :, None]
        found[f'block M/{size}'] = dims_read(ordered, bound, threshold).reshape(docs)
    return found


def thresholds(matrix: np.ndarray, queries: np.ndarray, rank: int = K) -> np.ndarray:
    """Each query's exact ``rank``-th best score over the whole index (one pass, chunk by chunk)."""
    best = np.full((len(queries), rank), -np.inf, dtype=np.float32)
    for start in range(0, matrix.shape[1], CHUNK):
        scores = queries @ matrix[:, start:start + CHUNK]
        both = np.concatenate([best, scores], axis=1)
        best = -np.partition(-both, rank - 1, axis=1)[:, :rank]
    return best.min(axis=1)


def topic_check(matrix: np.ndarray, state: dict, sample: int = 2000) -> str:
    """The generator's topics still match the cached index: cosine of sampled documents to their topic's centre
    against another topic's."""
    rng = np.random.default_rng(0)
    docs = np.sort(rng.choice(matrix.shape[1], size=sample, replace=False))
    vecs = np.asarray(matrix[:, docs]).T
    centres = state['centres']
    own = np.einsum('ij,ij->i', vecs, centres[state['topic_of'][docs]])
    other = np.einsum('ij,ij->i', vecs, centres[rng.integers(0, len(centres), size=sample)])
    return f'cosine to own topic centre {own.mean():.2f}, to a random one {other.mean():.2f}'


class Tally:
    """Dimensions x documents read per variant, summed over chunks. Keys: ``'BOUND|block|B'`` (a block of ``B``
    documents stops with its last document) and ``'BOUND|document'`` (each document stops on its own;
    ``'block M|document|B'`` with the bound of its block of ``B``)."""

    def __init__(self):
        self.read: Dict[str, float] = {}
        self.blocks: Dict[str, np.ndarray] = {}  # block-level key -> [blocks, skipped without a read, read in full]
        self.total = 0

    def add(self, found: Dict[str, np.ndarray], dims: int) -> None:
        self.total += dims * len(next(iter(found.values())))
        for variant, counts in found.items():
            bound, _, size = variant.partition('/')
            self._add(f'{bound}|document' + (f'|{size}' if size else ''), counts.sum())
            for block in ([int(size)] if size else BLOCK_SIZES):
                per_block = block_dims_read(counts, block)
                key = f'{bound}|block|{block}'
                self._add(key, per_block.sum() * block)
                self.blocks[key] = self.blocks.get(key, 0) + np.array(
                    [len(per_block), np.count_nonzero(per_block == 0), np.count_nonzero(per_block == dims)])

    def _add(self, key: str, value: float) -> None:
        self.read[key] = self.read.get(key, 0.0) + float(value)

    def shares(self) -> Dict[str, float]:
        return {key: value / self.total for key, value in self.read.items()}


def count_query_set(matrix: np.ndarray, abs_max: np.ndarray, queries: np.ndarray, theta: np.ndarray,
                    documents: Dict[str, np.ndarray], chunks: Sequence[int]) -> Dict[str, list]:
    """document order -> per query, the shares read per variant (and the block tallies), over the sampled chunks."""
    out = {}
    for order, columns in documents.items():
        tallies = [Tally() for _ in queries]
        for chunk in chunks:
            cols = columns[chunk * CHUNK:(chunk + 1) * CHUNK]
            block = np.asarray(matrix[:, cols[0]:cols[-1] + 1]) if order == 'index order' else matrix[:, cols]
            for query, threshold, tally in zip(queries, theta, tallies):
                kept = np.flatnonzero(query)
                kept = kept[np.argsort(-np.abs(query[kept]) * abs_max[kept], kind='stable')]
                found = stopping_points(block[kept].astype(np.float64), query[kept].astype(np.float64),
                                        abs_max[kept], float(threshold) - ROUNDING, BLOCK_SIZES)
                tally.add(found, len(kept))
        out[order] = tallies
    return out


def main(argv=None) -> int:
    from search import make_queries, pruned_query_sets
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    common.synthetic_index_options(parser)
    parser.add_argument('--queries', type=int, default=16)
    parser.add_argument('--chunks', type=int, default=3,
                        help=f'chunks of {CHUNK:,} documents counted, sampled at random among the full ones')
    parser.add_argument('--rank', type=int, default=K,
                        help=f'the threshold is the score of this rank: {K}, the exact k-th (the oracle); larger, a '
                             'running k-th such as a kernel knows partway through (the 1000th: after ~10 %% of the '
                             'documents in random order)')
    args = parser.parse_args(argv)
    title = (f'## Early termination by bounds: exact top-{K} over {args.docs:,} x {args.dims}, a count with the '
             f'{args.rank}th score as threshold\n')
    with common.session(args, args.threads, title) as run:
        index, state = common.synthetic_flex_index(args.cache, args.docs, args.dims)
        matrix, abs_max = layout.open_flex_layout(index)
        log(f'topics of the generator: {topic_check(matrix, state)}')
        sets = pruned_query_sets(index, matrix, make_queries(state, args.queries), (0.5,))
        full = matrix.shape[1] // CHUNK
        chunks = np.sort(np.random.default_rng(1).choice(full, size=min(args.chunks, full), replace=False))
        log(f'{args.queries} queries per set; counted over {len(chunks)} of {full} full chunks of {CHUNK:,} documents '
            f'(chunks {chunks.tolist()}: {len(chunks) * CHUNK / matrix.shape[1]:.0%} of the documents, the same for '
            f'every query); thresholds over all {matrix.shape[1]:,} documents')
        documents = {'index order': np.arange(matrix.shape[1]),
                     'grouped by topic': np.argsort(state['topic_of'], kind='stable')}
        rows, block_rows, results = [], [], {}
        for name, queries in sets.items():
            theta = thresholds(matrix, queries, args.rank)
            kept = np.mean(queries != 0)
            before = np.mean([np.abs(q) @ abs_max for q in queries])
            log(f'{name}: kept {kept:.2f}; threshold ({args.rank}th score) mean {theta.mean():.3f}; bound before '
                f'reading, sum |q_j| M_j, mean {before:.3f}')
            counted = count_query_set(matrix, abs_max, queries, theta, documents, chunks)
            for order, tallies in counted.items():
                shares = [t.shares() for t in tallies]
                mean = {key: float(np.mean([s[key] for s in shares])) for key in shares[0]}
                results[f'{name}/{order}'] = {'kept': float(kept), 'threshold': theta.tolist(), 'mean': mean,
                                              'per_query': shares}
                for size in BLOCK_SIZES:
                    block_level = [mean[f'{bound}|block|{size}'] for bound in BOUNDS]
                    document_level = [mean['global M|document'], mean[f'block M|document|{size}'],
                                      mean['Cauchy-Schwarz|document']]
                    rows.append([name, f'{kept:.2f}', order, size, *(f'{x:.3f}' for x in block_level + document_level)])
                    blocks, skipped, whole = sum(t.blocks[f'block M|block|{size}'] for t in tallies)
                    block_rows.append([name, order, size, f'{skipped / blocks:.3f}', f'{whole / blocks:.3f}'])
        log('\nshare of the kept rows\' bytes (kept dims x documents) still read, mean over queries; block: a block '
            'of B documents stops once every document\'s bound is below the threshold; document: each '
            'document stops on its own (block M: with its block\'s bound). 1.000 = no saving.\n')
        log(table(rows, ['queries', 'kept', 'documents', 'B', 'block, global M', 'block, block M',
                         'block, Cauchy-Schwarz', 'document, global M', 'document, block M', 'document, C-S']))
        log('\nblocks under the block-M bound: share skipped without reading a dimension / read in full.\n')
        log(table(block_rows, ['queries', 'documents', 'B', 'skipped whole', 'read whole']))
        run['results']['bounds'] = results
        log(f'\npeak RSS {common.max_rss_gib():.2f} GiB (the memory-mapped layout counts where its pages are resident)')
    return 0


if __name__ == '__main__':
    sys.exit(main())
