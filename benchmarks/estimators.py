#!/usr/bin/env python
"""How fast are the vectorised DIME + RDIME stages?

Queries/s of the vectorised DIME + RDIME stages on synthetic re-ranking frames (p = 384, 768; M = 2, 10) against a
per-query loop written like the reference code (pandas groupby, one query at a time), rounds interleaved; the
results of the two are checked to be identical.

Usage (from the repository root)::

    python benchmarks/run.py estimators            # ~2 min
"""
import argparse
import sys
from pathlib import Path

import common  # first: it sets the environment (offline hub, temporary PyTerrier homes)
import numpy as np
import pandas as pd
from common import interleaved, log, table

from pyterrier_rdime import maths
from pyterrier_rdime.dime import KernelDime
from pyterrier_rdime.threshold import Rdime


def rerank_frame(n_queries: int, depth: int, dims: int, seed: int) -> pd.DataFrame:
    """A ranked re-ranking frame from the paper's generative model: q = θ + εz, relevant d = θ + z, others z."""
    rng = np.random.default_rng(seed)
    theta = rng.standard_normal((n_queries, dims)).astype(np.float32)
    q = theta + 0.8 * rng.standard_normal((n_queries, dims)).astype(np.float32)
    relevant = rng.random((n_queries, depth)) < 0.3
    docs = rng.standard_normal((n_queries, depth, dims)).astype(np.float32)
    docs[relevant] += theta[np.nonzero(relevant)[0]]
    scores = np.einsum('np,nmp->nm', q, docs)
    order = np.argsort(-scores, axis=1, kind='stable')  # a first-stage ranking: by query, descending score
    scores = np.take_along_axis(scores, order, axis=1)
    docs = np.take_along_axis(docs, order[:, :, None], axis=1)
    qids = np.repeat([f'q{i}' for i in range(n_queries)], depth)
    return pd.DataFrame({'qid': qids, 'query': 'text', 'query_vec': list(q[np.repeat(np.arange(n_queries), depth)]),
                         'docno': [f'd{i}' for i in range(n_queries * depth)],
                         'doc_vec': list(docs.reshape(-1, dims)), 'score': scores.ravel(),
                         'rank': np.tile(np.arange(depth), n_queries)})


def reference_loop(frame: pd.DataFrame, kernel: str, num_docs: int, tau: float = 0.1) -> pd.DataFrame:
    """DIME + RDIME one query at a time, as the reference code does (pandas groupby, numpy inside the loop)."""
    out = []
    for qid, group in frame.groupby('qid', sort=False):
        q = np.asarray(group['query_vec'].iloc[0], dtype=np.float64)
        top = group.sort_values('score', ascending=False, kind='stable').head(num_docs)
        docs = np.stack(top['doc_vec'].tolist()).astype(np.float64)
        if kernel == 'softmax':
            sims = docs @ q / tau
            weights = np.exp(sims - sims.max())
            weights /= weights.sum()
        else:
            weights = np.full(len(docs), 1.0 / len(docs))
        u = q * (weights @ docs)
        eps2 = np.mean(q * q - u)
        keep = u > eps2
        fallback = not keep.any()
        if fallback:
            keep[:] = True
        pruned = np.where(keep, q, 0.0).astype(np.float32)
        group = group.copy()
        group['query_dime'] = [u.astype(np.float32)] * len(group)
        group['query_vec'] = [pruned] * len(group)
        group['query_kept'] = int(keep.sum())
        group['query_kept_frac'] = keep.mean()
        group['query_eps2'] = eps2
        group['query_fallback'] = fallback
        out.append(group)
    return pd.concat(out, ignore_index=True)


def maths_only(frame: pd.DataFrame, kernel: str, num_docs: int, n_queries: int, depth: int):
    """The stacked-array part alone (the frame is regular: query blocks of ``depth`` rows sorted by rank)."""
    dims = len(frame['query_vec'].iloc[0])
    q = np.stack(frame['query_vec'].to_numpy()[::depth]).astype(np.float64)
    order = np.argsort(-frame['score'].to_numpy().reshape(n_queries, depth), axis=1, kind='stable')[:, :num_docs]
    rows = (order + depth * np.arange(n_queries)[:, None]).ravel()
    docs = np.stack(frame['doc_vec'].to_numpy()[rows]).astype(np.float64).reshape(n_queries, num_docs, dims)

    def run():
        mask = np.ones((n_queries, num_docs), dtype=bool)
        w = maths.kernel_weights(kernel, q, docs, mask, tau=0.1)
        u = maths.kernel_dime(q, docs, w)
        keep, _ = maths.rdime_threshold(q, u)
        return maths.modulate(q, keep)
    return run


def bench_estimators(args) -> list:
    log(f'## Estimator throughput ({args.est_queries} queries x 100 candidates, synthetic)\n')
    rows, result = [], []
    for dims in (384, 768):
        frame = rerank_frame(args.est_queries, 100, dims, seed=dims)
        for label, kernel, num_docs in (('PRF', 'uniform', 2), ('PRF', 'uniform', 10), ('SWC', 'softmax', 2),
                                        ('SWC', 'softmax', 10)):
            stage = KernelDime(kernel=kernel, num_docs=num_docs) >> Rdime()
            ours, ref = stage(frame), reference_loop(frame, kernel, num_docs)
            same = all(np.array_equal(a, b) for a, b in zip(ours['query_vec'], ref['query_vec']))
            if not same:
                raise AssertionError(f'vectorised and reference-loop RDIME differ for {label} M={num_docs} p={dims}')
            core = maths_only(frame, kernel, num_docs, args.est_queries, 100)
            times = interleaved({'vectorised': lambda: stage(frame),
                                 'loop': lambda: reference_loop(frame, kernel, num_docs),
                                 'maths': core}, args.rounds_estimator)
            qps = {k: args.est_queries / np.median(v) for k, v in times.items()}
            rows.append([dims, f'{label} M={num_docs}', f'{qps["loop"]:,.0f}', f'{qps["vectorised"]:,.0f}',
                         f'**{qps["vectorised"] / qps["loop"]:.0f}×**', f'{qps["maths"]:,.0f}',
                         f'{ours.groupby("qid")["query_kept_frac"].first().mean():.2f}'])
            result.append({'dims': dims, 'dime': label, 'M': num_docs, 'qps_loop': qps['loop'],
                           'qps_vectorised': qps['vectorised'], 'qps_maths_only': qps['maths'],
                           'speedup': qps['vectorised'] / qps['loop']})
    log('queries/s, frame in -> frame out (query_dime, pruned query_vec, query_kept... on every row); results '
        'identical between the two.\n')
    log(table(rows, ['p', 'DIME', 'per-query loop', 'vectorised stages', 'speed-up', 'maths alone',
                     'kept (mean)']))
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--queries', type=int, default=500, help='queries per frame')
    parser.add_argument('--rounds', type=int, default=5, help='interleaved repetitions')
    parser.add_argument('--json', type=Path)
    args = parser.parse_args(argv)
    args.est_queries, args.rounds_estimator = args.queries, args.rounds
    with common.session(args, threads=1, note='\n') as run:  # one thread: stable ratios on a shared machine
        run['results']['estimators'] = bench_estimators(args)
    return 0


if __name__ == '__main__':
    sys.exit(main())
