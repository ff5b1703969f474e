#!/usr/bin/env python
"""Cost and speed of RDIME, measured side by side in one run (ratios, never absolute times across runs).

1. Pipeline overhead: re-ranking msmarco-dl19-pool's BM25 top-100 with cached MiniLM document vectors,
   ``bm25 >> query_encoder >> vec_loader >> index.scorer()`` against the same with ``PrfDime()``/``SwcDime()`` and
   ``Rdime()`` inserted (also without the query encoder, the harder comparison).
2. Estimator throughput: queries/s of the vectorised DIME + RDIME stages on synthetic re-ranking frames (p = 384, 768;
   M = 2, 10) against a per-query loop written like the reference code (pandas groupby, one query at a time).
3. Pruned exact search: full dense retrieval of the top-100 with RDIME-pruned queries over a seeded synthetic
   1M x 768 float32 matrix shaped like real embeddings (and over the real pool vectors), scoring only the kept
   dimensions (``PrunedRetriever``) against scoring every dimension with the zeroed query; checks that the top-100
   are the same up to float ties; speed-up by kept fraction and batch size; memory.

Usage (from the repository root; ``./run.sh benchmark`` runs the same)::

    python benchmarks/bench_rdime.py                 # everything, 1M documents (~7 min on 2 cores, 6.6 GB RAM)
    python benchmarks/bench_rdime.py --quick         # 200k documents, fewer repetitions (~4 min)
    python benchmarks/bench_rdime.py --only search --docs 500000 --threads 2 --json out.json

The first run also encodes the 4,297 BM25 candidates of the pool with MiniLM into ``--cache`` (~2.5 min).
"""
import argparse
import gc
import json
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault('TQDM_DISABLE', '1')  # pyterrier-dr's scorer always draws a progress bar
os.environ.setdefault('HF_HUB_OFFLINE', '1')
for _var in ('IR_DATASETS_HOME', 'PYTERRIER_HOME'):  # pyterrier-pisa writes folders there on import
    os.environ.setdefault(_var, tempfile.mkdtemp(prefix=f'bench-rdime-{_var.lower()}-'))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pyterrier as pt  # noqa: E402
from scipy.linalg import blas  # noqa: E402,F401  (load scipy's BLAS before limiting its threads)
from threadpoolctl import threadpool_limits  # noqa: E402

from pyterrier_rdime import maths  # noqa: E402
from pyterrier_rdime.dime import KernelDime, PrfDime, SwcDime  # noqa: E402
from pyterrier_rdime.pruned import PrunedRetriever, dimension_major, search_dense, search_pruned, top_k  # noqa: E402
from pyterrier_rdime.threshold import Rdime, TopK  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_COLLECTION = ROOT.parent / 'shared' / 'data' / 'msmarco-dl19-pool'
DEFAULT_CACHE = Path('~/.cache/pyterrier-rdime').expanduser()
RESULTS = {}


def log(*parts) -> None:
    print(*parts, flush=True)


def timed(fn):
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def interleaved(fns: dict, rounds: int) -> dict:
    """Run each function once per round, rotating the order; returns name -> list of seconds."""
    names = list(fns)
    times = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            times[n].append(timed(fns[n])[0])
    return times


def table(rows, header) -> str:
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '|'.join('---' for _ in header) + '|']
    lines += ['| ' + ' | '.join(str(c) for c in row) + ' |' for row in rows]
    return '\n'.join(lines)


def rss_gb() -> float:
    try:
        import psutil
        return psutil.Process().memory_info().rss / 2 ** 30
    except ImportError:
        return float('nan')


def max_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20


def machine() -> dict:
    model = platform.processor()
    try:
        for line in open('/proc/cpuinfo'):
            if line.startswith('model name'):
                model = line.split(':', 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import psutil
        memory = f'{psutil.virtual_memory().total / 2 ** 30:.0f} GiB'
    except ImportError:
        memory = '?'
    return {'cpu': model, 'cores': os.cpu_count(), 'memory': memory, 'python': platform.python_version(),
            'numpy': np.__version__, 'load_average_at_start': os.getloadavg()}


# ---------------------------------------------------------------------------------------------------------------
# 1. pipeline overhead on msmarco-dl19-pool
# ---------------------------------------------------------------------------------------------------------------

def bench_overhead(args) -> None:
    from pyterrier_rdime.experiment.collection import load_collection
    from pyterrier_rdime.experiment.encoders import load_encoder
    from pyterrier_rdime.experiment.runner import dense_index, first_stage_results

    log(f'\n## 1. Pipeline overhead (re-ranking {Path(args.collection).name}, BM25 top-100)\n')
    collection = load_collection(str(args.collection))
    first, source = first_stage_results(collection, 'run', 100, args.cache)
    model = load_encoder('minilm', verbose=False)
    start = time.time()
    index = dense_index(collection, model, 'minilm', args.cache, first['docno'].unique(), verbose=False)
    log(f'document vectors: {len(index)} cached in {args.cache} ({time.time() - start:.1f} s to open or build)')
    topics = collection.topics
    bm25 = pt.Transformer.from_df(first[['qid', 'docno', 'score', 'rank']])
    encoder = model.query_encoder()
    loader, scorer = index.vec_loader(), index.scorer()
    pipes = {
        'baseline': bm25 >> encoder >> loader >> scorer,
        'PRF+RDIME': bm25 >> encoder >> loader >> PrfDime() >> Rdime() >> scorer,
        'SWC+RDIME': bm25 >> encoder >> loader >> SwcDime() >> Rdime() >> scorer,
    }
    encoded = (bm25 >> encoder)(topics)
    stages = {
        'baseline': loader >> scorer,
        'PRF+RDIME': loader >> PrfDime() >> Rdime() >> scorer,
        'SWC+RDIME': loader >> SwcDime() >> Rdime() >> scorer,
    }
    for pipe in list(pipes.values()) + list(stages.values()):  # warm up (model, memory map, caches)
        pipe(encoded if pipe in stages.values() else topics)
    full = interleaved({k: (lambda p=p: p(topics)) for k, p in pipes.items()}, args.rounds_pipeline)
    only = interleaved({k: (lambda p=p: p(encoded)) for k, p in stages.items()}, args.rounds_pipeline)
    loaded = loader(encoded)
    prf, swc = PrfDime()(loaded), SwcDime()(loaded)
    parts = interleaved({'PrfDime': lambda: PrfDime()(loaded), 'SwcDime': lambda: SwcDime()(loaded),
                         'Rdime': lambda: Rdime()(prf), 'Rdime (after SWC)': lambda: Rdime()(swc),
                         'vec_loader': lambda: loader(encoded), 'index.scorer()': lambda: scorer(Rdime()(prf))},
                        args.rounds_pipeline)
    rows, result = [], {'queries': len(topics), 'rows': len(encoded)}
    for label, times in (('full pipeline (incl. query encoding)', full), ('after the encoder (vectors cached)', only)):
        base = np.array(times['baseline'])
        for name in ('PRF+RDIME', 'SWC+RDIME'):
            ratio = np.array(times[name]) / base
            med = float(np.median(ratio))
            rows.append([label, name, f'{np.median(base) * 1000:.0f} ms', f'{np.median(times[name]) * 1000:.0f} ms',
                         f'{(med - 1) * 100:+.1f} %', f'[{(np.quantile(ratio, .25) - 1) * 100:+.1f}, '
                         f'{(np.quantile(ratio, .75) - 1) * 100:+.1f}] %'])
            result[f'{label} / {name}'] = {'baseline_s': float(np.median(base)),
                                           'with_rdime_s': float(np.median(times[name])), 'overhead': med - 1}
    log(f'{len(topics)} queries, {len(encoded)} candidate rows; medians over interleaved rounds; overhead = median '
        'of the per-round ratios (interquartile range).\n')
    log(table(rows, ['what is timed', 'stages added', 'baseline', 'with DIME+RDIME', 'overhead', 'IQR']))
    log('\nstage costs (median): ' + ', '.join(f'{k} {np.median(v) * 1000:.1f} ms' for k, v in parts.items()))
    base_full = float(np.median(full['baseline']))
    for name, dime in (('PRF+RDIME', 'PrfDime'), ('SWC+RDIME', 'SwcDime')):
        added = float(np.median(parts[dime]) + np.median(parts['Rdime']))
        log(f'{name}: the added stages take {added * 1000:.1f} ms = {100 * added / base_full:.1f} % of the full '
            f'pipeline ({base_full * 1000:.0f} ms), {added / len(topics) * 1e6:.0f} µs per query')
        result[f'added/{name}'] = {'ms': added * 1000, 'fraction_of_full_pipeline': added / base_full}
    result['stage_ms'] = {k: float(np.median(v) * 1000) for k, v in parts.items()}
    RESULTS['overhead'] = result


# ---------------------------------------------------------------------------------------------------------------
# 2. estimator throughput
# ---------------------------------------------------------------------------------------------------------------

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
        return maths.prune(q, keep)
    return run


def bench_estimators(args) -> None:
    log(f'\n## 2. Estimator throughput ({args.est_queries} queries x 100 candidates, synthetic)\n')
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
    RESULTS['estimators'] = result


# ---------------------------------------------------------------------------------------------------------------
# 3. pruned exact search
# ---------------------------------------------------------------------------------------------------------------

def synthetic_corpus(docs: int, dims: int, seed: int, chunk: int = 65536):
    """Unit-norm float32 vectors shaped like sentence embeddings: a shared mean direction, per-dimension scales
    spread log-normally (a few dominant dimensions), documents clustered around topics (~100 per topic).
    Returns (doc-major vectors (docs, dims), topic centres, topic of each document)."""
    rng = np.random.default_rng(seed)
    scale = np.exp(0.5 * rng.standard_normal(dims)).astype(np.float32)
    scale /= np.sqrt(np.mean(scale ** 2))
    mean = (rng.standard_normal(dims) * scale).astype(np.float32)
    mean *= 0.6 / np.linalg.norm(mean)
    topics = max(1, docs // 100)
    centres = rng.standard_normal((topics, dims)).astype(np.float32) * scale
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    topic_of = rng.integers(0, topics, size=docs)
    vecs = np.empty((docs, dims), dtype=np.float32)
    for start in range(0, docs, chunk):
        end = min(docs, start + chunk)
        noise = rng.standard_normal((end - start, dims), dtype=np.float32) * scale
        noise *= 0.9 / np.linalg.norm(noise, axis=1, keepdims=True)
        block = mean + centres[topic_of[start:end]] + noise
        vecs[start:end] = block / np.linalg.norm(block, axis=1, keepdims=True)
    return vecs, centres, mean, scale, topic_of


def pruned_queries(doc_vecs: np.ndarray, dim_major: np.ndarray, query_vecs: np.ndarray, thresholds) -> dict:
    """Full retrieval of 10 feedback documents, PRF DIME, then each threshold: name -> (n, dims) pruned queries."""
    qframe = pd.DataFrame({'qid': [f'q{i}' for i in range(len(query_vecs))], 'query': 'text',
                           'query_vec': list(query_vecs.astype(np.float32))})
    scores, docids = search_dense(dim_major, query_vecs, 10)
    first = qframe.iloc[np.repeat(np.arange(len(qframe)), 10)].reset_index(drop=True).assign(
        docno=[str(d) for d in np.concatenate(docids)], docid=np.concatenate(docids),
        score=np.concatenate(scores), rank=np.tile(np.arange(10), len(qframe)))
    first['doc_vec'] = list(np.asarray(doc_vecs[first['docid'].to_numpy()], dtype=np.float32))
    scored = PrfDime(keep_ranking=False)(first)
    out = {}
    for name, threshold in thresholds.items():
        pruned = threshold(scored)
        out[name] = np.stack(pruned['query_vec']).astype(np.float32)
    return out


def check_topk(dim_major: np.ndarray, query_vec: np.ndarray, ref, new, atol: float) -> str:
    """'identical', 'ties' (differs only among documents whose exact scores are within atol) or 'MISMATCH'."""
    (ref_s, ref_i), (new_s, new_i) = ref, new
    if np.array_equal(ref_i, new_i) and np.allclose(ref_s, new_s, rtol=0, atol=atol):
        return 'identical'
    exact = (query_vec.astype(np.float64) @ dim_major[:, new_i].astype(np.float64))
    ok = (len(new_i) == len(ref_i) and np.allclose(np.sort(new_s)[::-1], np.sort(ref_s)[::-1], rtol=0, atol=atol)
          and exact.min() >= ref_s.min() - atol and np.all(np.diff(exact) <= atol)
          and len(set(new_i.tolist())) == len(new_i))
    return 'ties' if ok else 'MISMATCH'


def bench_search(args) -> None:
    docs, dims, k = args.docs, args.dims, 100
    log(f'\n## 3. Pruned exact search (top-{k}; {docs:,} x {dims} synthetic float32, then the real pool vectors)\n')
    rss0 = rss_gb()
    build_s, (doc_vecs, centres, mean, scale, topic_of) = timed(lambda: synthetic_corpus(docs, dims, seed=42))
    dim_s, dim_major = timed(lambda: dimension_major(doc_vecs))
    rss1 = rss_gb()
    log(f'generated in {build_s:.0f} s; dimension-major copy built in {dim_s:.1f} s; doc-major matrix '
        f'{doc_vecs.nbytes / 2 ** 30:.2f} GiB + dimension-major copy {dim_major.nbytes / 2 ** 30:.2f} GiB; '
        f'process RSS {rss0:.2f} -> {rss1:.2f} GiB')
    rng = np.random.default_rng(7)
    n = args.queries
    which = rng.integers(0, len(centres), size=n)
    noise = rng.standard_normal((n, dims)).astype(np.float32) * scale
    raw = mean + centres[which] + 0.9 * noise / np.linalg.norm(noise, axis=1, keepdims=True)
    raw = (raw / np.linalg.norm(raw, axis=1, keepdims=True)).astype(np.float32)
    fractions = [0.25, 0.5, 0.75]
    thresholds = {'RDIME': Rdime(), **{f'Top-k {f:.2f}': TopK(k=f) for f in fractions}}
    sets = pruned_queries(doc_vecs, dim_major, raw, thresholds)
    atol = 1e-5 * float(np.abs(raw).sum(axis=1).max())

    # b = 1: one query at a time (latency), interleaved per query
    rows, per_query, checks, result = [], [], {}, {'docs': docs, 'dims': dims,
                                                  'doc_major_gib': doc_vecs.nbytes / 2 ** 30,
                                                  'dim_major_gib': dim_major.nbytes / 2 ** 30}
    for name, queries in sets.items():
        totals = {'dense': [], 'doc-major': [], 'pruned': []}
        status = []
        for qz in queries:
            fns = {'dense': lambda: search_dense(dim_major, qz[None], k),
                   'doc-major': lambda: top_k(doc_vecs @ qz, k),
                   'pruned': lambda: search_pruned(dim_major, qz[None], k)}
            times = interleaved(fns, args.rounds_search)
            for key in totals:
                totals[key].append(float(np.median(times[key])))
            ref = search_dense(dim_major, qz[None], k)
            new = search_pruned(dim_major, qz[None], k)
            status.append(check_topk(dim_major, qz, (ref[0][0], ref[1][0]), (new[0][0], new[1][0]), atol))
            per_query.append({'set': name, 'kept': float(np.mean(qz != 0)), 'dense': totals['dense'][-1],
                              'doc_major': totals['doc-major'][-1], 'pruned': totals['pruned'][-1]})
        kept = float(np.mean(queries != 0))
        t = {key: float(np.sum(v)) for key, v in totals.items()}
        checks[name] = {s: status.count(s) for s in ('identical', 'ties', 'MISMATCH')}
        rows.append([name, f'{kept:.2f}', f'{1 / kept:.2f}', f'{t["dense"] / len(queries) * 1000:.0f} ms',
                     f'{t["pruned"] / len(queries) * 1000:.0f} ms', f'**{t["dense"] / t["pruned"]:.2f}×**',
                     f'{t["doc-major"] / t["pruned"]:.2f}×',
                     f'{checks[name]["identical"]}/{checks[name]["ties"]}/{checks[name]["MISMATCH"]}'])
        result[f'b1/{name}'] = {'kept': kept, 'speedup_vs_dense': t['dense'] / t['pruned'],
                                'speedup_vs_doc_major': t['doc-major'] / t['pruned'], 'check': checks[name]}
    log(f'one query at a time (batch size 1), {n} queries per row, each timed {args.rounds_search}x interleaved '
        '(median); speed-up = total time of full-dimension scoring / pruned scoring, top-100 included.\n')
    log(table(rows, ['queries', 'kept fraction', '1/fraction', 'all dims (zeroed query)', 'kept dims only',
                     'speed-up', 'vs doc-major gemv', 'top-100 identical/ties/mismatch']))
    frame = pd.DataFrame(per_query)
    frame['speedup'] = frame['dense'] / frame['pruned']
    bins = pd.cut(frame['kept'], [0, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 1.0])
    by_bin = frame.groupby(bins, observed=True).agg(queries=('kept', 'size'), kept=('kept', 'mean'),
                                                    speedup=('speedup', 'median'))
    log('\nper-query speed-up (median) by kept fraction, all query sets together:\n')
    log(table([[str(i), int(r.queries), f'{r.kept:.2f}', f'{1 / r.kept:.2f}', f'{r.speedup:.2f}×']
               for i, r in by_bin.iterrows()], ['kept fraction', 'queries', 'mean kept', '1/fraction', 'speed-up']))
    result['by_kept_fraction'] = [{'bin': str(i), 'queries': int(r.queries), 'kept': float(r.kept),
                                   'speedup': float(r.speedup)} for i, r in by_bin.iterrows()]

    # batches: the whole query set at once
    rows = []
    retriever = PrunedRetriever(index=dim_major.T, num_results=k)  # a Fortran-ordered view: shares the copy
    for name in ('RDIME', 'Top-k 0.25'):
        queries = sets[name]
        for b in sorted({b for b in (1, 2, 3, 4, 8, 16, len(queries)) if b <= len(queries)}):
            batch = queries[:b]
            times = interleaved({'dense': lambda: search_dense(dim_major, batch, k, batch_size=b),
                                 'pruned': lambda: search_pruned(dim_major, batch, k)}, args.rounds_search)
            dense_t, pruned_t = float(np.median(times['dense'])), float(np.median(times['pruned']))
            auto = retriever.choose_strategy(batch)
            rows.append([name, b, f'{np.mean(batch != 0):.2f}', f'{np.mean((batch != 0).any(axis=0)):.2f}',
                         f'{dense_t / b * 1000:.0f} ms', f'{pruned_t / b * 1000:.0f} ms',
                         f'{dense_t / pruned_t:.2f}×', auto,
                         f'{dense_t / (pruned_t if auto == "pruned" else dense_t):.2f}×'])
            result[f'batch/{name}/{b}'] = {'pruned_over_dense_speedup': dense_t / pruned_t, 'auto': auto}
    log('\nbatches of the first b queries (time per query; all dims = the dense path: one gemv per query below 4 '
        'queries, else one matrix product per batch and block of 32k documents):\n')
    log(table(rows, ['queries', 'batch', 'kept', 'union of kept dims', 'all dims (dense path)',
                     'kept dims only (per query)', 'speed-up of pruned', "auto's choice", 'speed-up of auto']))
    result['max_rss_gib'] = max_rss_gb()
    log(f'\nmemory: doc-major {doc_vecs.nbytes / 2 ** 30:.2f} GiB, dimension-major copy (the PrunedRetriever\'s) '
        f'{dim_major.nbytes / 2 ** 30:.2f} GiB, per-query score buffer {docs * 4 / 2 ** 20:.1f} MiB; '
        f'peak process RSS {result["max_rss_gib"]:.2f} GiB')
    RESULTS['search'] = result


def bench_search_real(args) -> None:
    from pyterrier_rdime.experiment.collection import load_collection
    from pyterrier_rdime.experiment.encoders import load_encoder
    from pyterrier_rdime.experiment.runner import dense_index, first_stage_results

    collection = load_collection(str(args.collection))
    first, _ = first_stage_results(collection, 'run', 100, args.cache)
    model = load_encoder('minilm', verbose=False)
    index = dense_index(collection, model, 'minilm', args.cache, first['docno'].unique(), verbose=False)
    k = 100
    queries = model.query_encoder()(collection.topics)
    dense = PrunedRetriever(index=index, num_results=k, strategy='dense')
    pruned = PrunedRetriever(index=index, num_results=k, strategy='pruned')
    auto = PrunedRetriever(index=index, num_results=k)
    feedback = PrunedRetriever(index=index, num_results=10, strategy='dense') >> index.vec_loader()
    rows = []
    for name, dime in (('PRF+RDIME', PrfDime(keep_ranking=False)), ('SWC+RDIME', SwcDime(keep_ranking=False))):
        q = (feedback >> dime >> Rdime())(queries)
        a, b, c = dense(q), pruned(q), index.np_retriever(num_results=k)(q)
        dim_major = dense.dim_major()
        qv = np.stack(q['query_vec']).astype(np.float32)
        atol = 1e-5 * float(np.abs(qv).sum(axis=1).max())
        status = []
        for i, qid in enumerate(q['qid']):
            ra, rb = a[a['qid'] == qid], b[b['qid'] == qid]
            status.append(check_topk(dim_major, qv[i], (ra['score'].to_numpy(), ra['docid'].to_numpy()),
                                     (rb['score'].to_numpy(), rb['docid'].to_numpy()), atol))
            rc = c[c['qid'] == qid]
            status.append(check_topk(dim_major, qv[i], (ra['score'].to_numpy(), ra['docid'].to_numpy()),
                                     (rc['score'].to_numpy().astype(np.float32), rc['docid'].to_numpy()), atol))
        one = [q.iloc[[i]] for i in range(len(q))]
        times = interleaved({'dense': lambda: [dense(x) for x in one], 'pruned': lambda: [pruned(x) for x in one],
                             'auto': lambda: [auto(x) for x in one],
                             'batch dense': lambda: dense(q)}, args.rounds_search * 3)
        med = {key: float(np.median(v)) for key, v in times.items()}
        rows.append([name, len(q), f'{np.mean(qv != 0):.2f}', f'{med["dense"] / med["pruned"]:.2f}×',
                     auto.choose_strategy(qv[:1]), f'{med["dense"] / med["auto"]:.2f}×',
                     f'{status.count("identical")}/{status.count("ties")}/{status.count("MISMATCH")}'])
    log(f'\nreal pool vectors ({len(index):,} x {dense.dim_major().shape[0]}, MiniLM; stage level, one query per '
        'call; exactness against the dense path and pyterrier-dr\'s np_retriever):\n')
    log(table(rows, ['queries', 'n', 'kept', 'pruned vs dense', "auto's choice", 'auto vs dense',
                     'top-100 identical/ties/mismatch']))
    RESULTS['search_real'] = rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--only', default='overhead,estimators,search',
                        help='comma-separated sections among overhead, estimators, search')
    parser.add_argument('--collection', type=Path, default=DEFAULT_COLLECTION)
    parser.add_argument('--cache', type=Path, default=DEFAULT_CACHE,
                        help='cache of document vectors and indexes (built if missing)')
    parser.add_argument('--docs', type=int, default=1_000_000, help='documents of the synthetic matrix')
    parser.add_argument('--dims', type=int, default=768)
    parser.add_argument('--queries', type=int, default=32, help='queries of the search benchmark')
    parser.add_argument('--est-queries', type=int, default=500, help='queries of the estimator benchmark')
    parser.add_argument('--threads', type=int, default=1,
                        help='BLAS threads (default 1: stable ratios on a shared machine; 0 = library default)')
    parser.add_argument('--quick', action='store_true', help='200k documents, fewer queries and repetitions')
    parser.add_argument('--json', type=Path, help='also write the measurements here')
    args = parser.parse_args(argv)
    args.only = set(args.only.split(','))
    args.rounds_pipeline, args.rounds_estimator, args.rounds_search = 31, 5, 3
    if args.quick:
        args.docs, args.queries, args.est_queries = min(args.docs, 200_000), min(args.queries, 16), 200
        args.rounds_pipeline, args.rounds_estimator = 11, 3
    info = machine()
    log('# pyterrier-rdime benchmark\n')
    log(f'machine: {info["cpu"]}, {info["cores"]} cores, {info["memory"]}; Python {info["python"]}, numpy '
        f'{info["numpy"]}; BLAS threads: {args.threads or "default"}; load average at start '
        f'{", ".join(f"{x:.1f}" for x in info["load_average_at_start"])}')
    limits = threadpool_limits(args.threads, user_api='blas') if args.threads else None
    try:
        if 'overhead' in args.only:
            bench_overhead(args)
        if 'estimators' in args.only:
            bench_estimators(args)
        if 'search' in args.only:
            bench_search(args)
            gc.collect()
            if args.collection.is_dir():
                bench_search_real(args)
    finally:
        if limits is not None:
            limits.unregister()
    info['load_average_at_end'] = os.getloadavg()
    log(f'\nload average at end: {", ".join(f"{x:.1f}" for x in info["load_average_at_end"])}')
    if args.json:
        args.json.write_text(json.dumps({'machine': info, 'args': {k: str(v) for k, v in vars(args).items()},
                                         **RESULTS}, indent=1, default=float))


if __name__ == '__main__':
    sys.exit(main())
