#!/usr/bin/env python
"""What does one query cost end to end in retrieve mode, and when does pruning pay?

Per-query latency of four pipelines, one query per call (what an interactive user feels), as the sum of their stages
each timed on this machine in blocks (each stage several times in a row per round, the fastest kept; the median
over rounds reported):

- dense: query encoder + exact dense retrieval (top-1000);
- the paper: query encoder + dense top-10 for the feedback + ``vec_loader`` + ``PrfDime`` + ``Rdime`` + a second
  dense retrieval with the zeroed query (and the same with ``PrunedRetriever`` as the second retrieval);
- the fast paper pipeline: the same, its feedback top-10 on the compressed path (the int8 copy's bound, the full
  query, exact) and ``PrunedRetriever`` as the second retrieval: the same documents and scores, less work;
- BM25 feedback: BM25 top-10 + query encoder + ``vec_loader`` + ``PrfDime`` + ``Rdime`` + ``PrunedRetriever``;
- LLM answer: query encoder + answer encoder + ``LlmDime`` + ``Rdime`` + ``PrunedRetriever`` (the answer generated
  offline, as ``LlmAnswers`` reads it: its generation is not counted).

The retrievals run over the seeded synthetic FlexIndex of ``search`` (default 1M x 768, cached); the queries are
pruned to the kept fractions that RDIME kept with each feedback in the vaswani retrieve-mode runs (``--kept``). The
encoder and BM25 are timed on vaswani's real queries and abstracts (11,429 documents: BM25 on a corpus of 1M costs
more); the encoder is MiniLM (384 dimensions) and, with ``--mpnet PATH``, all-mpnet-base-v2 (768, the index's
width).

Usage (from the repository root)::

    python benchmarks/run.py pipelines --mpnet PATH/all-mpnet-base-v2  # PATH: where you downloaded it
"""
import argparse
import json
import shutil
import sys
from pathlib import Path

import common  # first: it sets the environment (offline hub, temporary PyTerrier homes)
import numpy as np
import pandas as pd
from common import log, table

from pyterrier_rdime import LlmDime, PrfDime, PrunedRetriever, Rdime, TopK

NUM_RESULTS = 1000


def median_ms(fns: dict, args) -> dict:
    times = common.blocks(fns, args.rounds, args.per_block)
    return {name: float(np.median(t)) * 1000 for name, t in times.items()}


def vaswani():
    """The ir_datasets vaswani dataset, read offline from the copy beside the project (as the tests do) if present."""
    import ir_datasets
    home = Path(common.os.environ['IR_DATASETS_HOME'])
    shared = common.ROOT.parent / 'shared' / 'irds' / 'vaswani'
    if shared.is_dir() and not (home / 'vaswani').exists():
        shutil.copytree(shared, home / 'vaswani')
    return ir_datasets.load('vaswani')


def text_costs(args) -> dict:
    """Per-query milliseconds of the query encoder(s), an answer-length text and BM25 top-10 on vaswani."""
    import pyterrier_pisa

    from pyterrier_rdime.experiment.encoders import load_encoder
    dataset = vaswani()
    queries = [q.text for q in dataset.queries_iter()][:args.queries]
    docs = list(dataset.docs_iter())
    answers = [d.text for d in docs[:args.queries]]  # an abstract stands for an LLM answer of a paragraph
    pisa_path = args.cache / 'vaswani.pisa'
    if not (pisa_path / 'pt_meta.json').exists():
        pyterrier_pisa.PisaIndex(str(pisa_path), stemmer='porter2', text_field='text').index(
            {'docno': d.doc_id, 'text': d.text} for d in docs)
    bm25 = pyterrier_pisa.PisaIndex(str(pisa_path), stemmer='porter2', text_field='text').bm25(num_results=10)
    frames = [pd.DataFrame({'qid': [str(i)], 'query': [q]}) for i, q in enumerate(queries)]
    import torch
    # torch's own thread pool, apart from BLAS's: with two threads on a machine whose cores other jobs keep busy, one
    # query took 4.3 s against 154 ms with one (its threads wait on each other at every layer)
    torch.set_num_threads(args.torch_threads)
    encoders = {'MiniLM': load_encoder('minilm', verbose=False)}
    if args.mpnet:
        encoders['mpnet'] = load_encoder(str(args.mpnet), verbose=False)
    fns = {'BM25 top-10': lambda: [bm25(f) for f in frames]}
    for name, model in encoders.items():
        encode = model.query_encoder()
        answer_frames = [f.assign(query=a) for f, a in zip(frames, answers)]
        fns[f'{name} query'] = lambda e=encode: [e(f) for f in frames]
        fns[f'{name} answer'] = lambda e=encode, a=answer_frames: [e(f) for f in a]
    for fn in fns.values():
        fn()  # load the models, compress the PISA index
    return {name: ms / len(queries) for name, ms in median_ms(fns, args).items()}


def search_costs(args, kept_fracs: dict) -> dict:
    """Per-query milliseconds of the retrieval-side stages on the synthetic index."""
    from search import make_queries
    index, state = common.synthetic_flex_index(args.cache, args.docs, args.dims)
    raw = make_queries(state, args.queries)
    frame = pd.DataFrame({'qid': [f'q{i}' for i in range(len(raw))], 'query': 'text', 'query_vec': list(raw)})
    one = [frame.iloc[[i]] for i in range(len(frame))]
    dense = PrunedRetriever(index=index, num_results=NUM_RESULTS, strategy='dense')
    feedback = PrunedRetriever(index=index, num_results=10, strategy='dense')
    compressed_feedback = PrunedRetriever(index=index, num_results=10, strategy='compressed')
    loader = index.vec_loader()
    fed = [feedback(q) for q in one]
    loaded = [loader(f) for f in fed]
    prf = PrfDime(keep_ranking=False)
    scored = [prf(x) for x in loaded]
    answered = [q.assign(query_answer_vec=[v]) for q, v in zip(one, make_queries(state, len(one), seed=8))]
    auto = PrunedRetriever(index=index, num_results=NUM_RESULTS)
    pruned = {name: [TopK(fraction=f)(s) for s in scored] for name, f in kept_fracs.items()}
    fns = {'dense retrieval': lambda: [dense(q) for q in one],
           'dense top-10 (feedback)': lambda: [feedback(q) for q in one],
           'compressed top-10 (feedback)': lambda: [compressed_feedback(q) for q in one],
           'vec_loader (10 docs)': lambda: [loader(f) for f in fed],
           'PrfDime + Rdime': lambda: [Rdime()(prf(x)) for x in loaded],
           'LlmDime + Rdime': lambda: [Rdime()(LlmDime()(a)) for a in answered],
           **{f'PrunedRetriever ({name}, kept {kept_fracs[name]:.2f})': (lambda p=p: [auto(x) for x in p])
              for name, p in pruned.items()}}
    for fn in fns.values():
        fn()
    for got, want in zip(fns['compressed top-10 (feedback)'](), fed):  # exact: the same feedback as the dense top-10
        pd.testing.assert_frame_equal(got[['qid', 'docno']].reset_index(drop=True),
                                      want[['qid', 'docno']].reset_index(drop=True))
    times = {name: ms / len(one) for name, ms in median_ms(fns, args).items()}
    times['choices'] = {name: auto.plan(np.stack(p[0]['query_vec'])).strategy for name, p in pruned.items()}
    return times


def effectiveness(args) -> dict:
    """nDCG@10 on vaswani (93 queries, MiniLM, full retrieval of the top 1000 over ``--vaswani-index``, the FlexIndex
    of all 11,429 abstracts) of the pipelines that vaswani can run (it has no LLM answers), and RDIME's kept
    fraction with each feedback."""
    import ir_measures
    import pyterrier_pisa
    from pyterrier_dr import FlexIndex

    from pyterrier_rdime.experiment.encoders import load_encoder
    dataset = vaswani()
    topics = pd.DataFrame([{'qid': q.query_id, 'query': q.text.replace('\n', ' ')} for q in dataset.queries_iter()])
    qrels = pd.DataFrame([{'query_id': q.query_id, 'doc_id': q.doc_id, 'relevance': q.relevance}
                          for q in dataset.qrels_iter()])
    index = FlexIndex(str(args.vaswani_index), verbose=False)
    encoder = load_encoder('minilm', verbose=False).query_encoder()
    bm25 = pyterrier_pisa.PisaIndex(str(args.cache / 'vaswani.pisa'), stemmer='porter2', text_field='text').bm25(
        num_results=10)
    dense = PrunedRetriever(index=index, num_results=NUM_RESULTS, strategy='dense')
    pruned = PrunedRetriever(index=index, num_results=NUM_RESULTS)
    feedback = PrunedRetriever(index=index, num_results=10, strategy='dense') >> index.vec_loader()
    rdime = PrfDime(keep_ranking=False) >> Rdime()
    encoded = encoder(topics)
    dense_q = (feedback >> rdime)(encoded)
    bm25_q = (bm25 >> encoder >> index.vec_loader() >> rdime)(topics)
    bm25_q = bm25_q.drop_duplicates('qid')[['qid', 'query', 'query_vec', 'query_kept_frac']]
    runs = {'dense retrieval': (dense(encoded), 1.0),
            'dense-PRF feedback + RDIME + dense retrieval (the paper)': (dense(dense_q),
                                                                         dense_q['query_kept_frac'].mean()),
            'dense-PRF feedback + RDIME + PrunedRetriever': (pruned(dense_q), dense_q['query_kept_frac'].mean()),
            'BM25 feedback + RDIME + PrunedRetriever': (pruned(bm25_q), bm25_q['query_kept_frac'].mean())}
    out = {}
    for name, (run, kept) in runs.items():
        run = run.rename(columns={'qid': 'query_id', 'docno': 'doc_id'})
        out[name] = {'nDCG@10': ir_measures.calc_aggregate([ir_measures.nDCG @ 10], qrels, run)[ir_measures.nDCG @ 10],
                     'kept': float(kept)}
    log('\nnDCG@10 on vaswani (MiniLM, top-1000 over the whole corpus):\n')
    log(table([[n, f'{v["nDCG@10"]:.4f}', f'{v["kept"]:.2f}'] for n, v in out.items()],
              ['pipeline', 'nDCG@10', 'kept']))
    return out


def plot(result: dict, ndcg: dict, path: Path, load: float) -> None:
    """nDCG@10 (MiniLM on vaswani) against per-query latency with the MiniLM encoder, one point per pipeline (its
    marker the feedback, its colour the retriever, named in the legend), written as SVG; ``load``: the load average
    when the latencies were measured."""
    import matplotlib
    matplotlib.use('Agg')
    matplotlib.rcParams['svg.fonttype'] = 'none'  # text as text: a small, diffable file
    import matplotlib.pyplot as plt
    markers = {'dense retrieval': 's', 'dense-PRF': 'o', 'BM25': '^', 'LLM': 'D'}
    fig, ax = plt.subplots(figsize=(7, 4))
    for key, row in result.items():
        encoder, name = key.split('/', 1)
        if name in ndcg and encoder == 'MiniLM':
            marker = next(m for feedback, m in markers.items() if name.startswith(feedback))
            ax.plot(row['ms'], ndcg[name], marker=marker, ms=8, linestyle='none',
                    color='C0' if 'Pruned' in name else 'C1', label=f'{name} ({row["ms"]:.0f} ms)')
    ax.set_title('vaswani, MiniLM: effectiveness against latency per query', fontsize=10)
    ax.set_xlabel(f'latency per query (ms; synthetic 1M x 768 index, 2 cores, load {load:.1f})')
    ax.set_ylabel('nDCG@10 (top 1000)')
    ax.set_xlim(0, 1.15 * max(ax.get_xlim()))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc='center right', title='pipeline (orange: dense search, blue: PrunedRetriever)',
              title_fontsize=7)
    fig.tight_layout()
    fig.savefig(path, format='svg', metadata={'Date': None})
    log(f'plot written to {path}')


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    common.synthetic_index_options(parser)
    parser.add_argument('--queries', type=int, default=8, help='queries timed, one per call')
    parser.add_argument('--rounds', type=int, default=5)
    parser.add_argument('--per-block', type=int, default=2)
    parser.add_argument('--kept', default='dense PRF=0.46,BM25 PRF=0.37,LLM=0.53',
                        help='kept fraction of RDIME per feedback (vaswani retrieve mode, MiniLM; LLM: DL19)')
    parser.add_argument('--mpnet', type=Path, help='an all-mpnet-base-v2 folder, to time it too')
    parser.add_argument('--torch-threads', type=int, default=1, help='threads of the encoders (default: %(default)s)')
    parser.add_argument('--ndcg', default='', help="nDCG@10 of each pipeline, 'PIPELINE=VALUE;...', for --plot")
    parser.add_argument('--plot', type=Path, help='an SVG of nDCG@10 against latency (with --ndcg)')
    parser.add_argument('--from-json', type=Path, help='plot the pipelines of an earlier --json run, measure nothing')
    parser.add_argument('--vaswani-index', type=Path, help='a MiniLM FlexIndex of all vaswani abstracts: measure the '
                                                           "pipelines' nDCG@10 on it (only that, with --from-json)")
    args = parser.parse_args(argv)
    ndcg = {name: float(v) for name, v in (part.rsplit('=', 1) for part in args.ndcg.split(';') if part)}
    if args.from_json:
        if args.vaswani_index:
            ndcg.update({name: v['nDCG@10'] for name, v in effectiveness(args).items()})
        if args.plot:
            measured = json.loads(args.from_json.read_text())
            plot(measured['pipelines'], ndcg, args.plot, measured['machine']['load_average_at_start'][0])
        return 0
    kept_fracs = {name: float(f) for name, f in (part.split('=') for part in args.kept.split(','))}
    title = f'## End-to-end cost per query, retrieve mode: top-{NUM_RESULTS} over {args.docs:,} x {args.dims}\n'
    with common.session(args, args.threads, title) as run:
        args.cache.mkdir(parents=True, exist_ok=True)
        text = text_costs(args)
        search = search_costs(args, kept_fracs)
        log('\nstage costs, ms per query (median over rounds of the fastest call in each block):\n')
        log(table([[k, f'{v:.1f}'] for k, v in {**text, **search}.items() if k != 'choices'], ['stage', 'ms / query']))
        rows, result = [], {}
        for encoder in [k.split()[0] for k in text if k.endswith(' query')]:
            enc, ans = text[f'{encoder} query'], text[f'{encoder} answer']
            dense, fb = search['dense retrieval'], search['dense top-10 (feedback)']
            compressed_fb = search['compressed top-10 (feedback)']
            load = search['vec_loader (10 docs)']
            prf, llm = search['PrfDime + Rdime'], search['LlmDime + Rdime']

            def pruned(name):
                return search[f'PrunedRetriever ({name}, kept {kept_fracs[name]:.2f})']
            pipelines = {
                'dense retrieval': (enc + dense, 1.0),
                'dense-PRF feedback + RDIME + dense retrieval (the paper)': (enc + fb + load + prf + dense,
                                                                             kept_fracs['dense PRF']),
                'dense-PRF feedback + RDIME + PrunedRetriever': (enc + fb + load + prf + pruned('dense PRF'),
                                                                 kept_fracs['dense PRF']),
                'compressed dense-PRF feedback + RDIME + PrunedRetriever (fast paper)': (
                    enc + compressed_fb + load + prf + pruned('dense PRF'), kept_fracs['dense PRF']),
                'BM25 feedback + RDIME + PrunedRetriever': (text['BM25 top-10'] + enc + load + prf + pruned('BM25 PRF'),
                                                            kept_fracs['BM25 PRF']),
                'LLM answer + RDIME + PrunedRetriever': (enc + ans + llm + pruned('LLM'), kept_fracs['LLM']),
            }
            for name, (ms, frac) in pipelines.items():
                rows.append([encoder, name, f'{frac:.2f}', f'{ms:.0f} ms',
                             f'{ms / pipelines["dense retrieval"][0]:.2f}×'])
                result[f'{encoder}/{name}'] = {'ms': ms, 'kept': frac}
        log(f'\n### Per-query latency (encoder + search stages above; auto chose: {search["choices"]})\n')
        log(table(rows, ['encoder', 'pipeline', 'kept', 'latency', 'vs dense retrieval']))
        run['results'].update({'stages': {**text, **search}, 'pipelines': result})
    if args.plot:
        plot(result, ndcg, args.plot, run['machine']['load_average_at_start'][0])
    return 0


if __name__ == '__main__':
    sys.exit(main())
