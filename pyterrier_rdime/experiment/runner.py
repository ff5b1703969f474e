"""The paper's comparison as one call: Baseline, and for each DIME each Top-k and RDIME, through pt.Experiment."""
import contextlib
import ctypes
import hashlib
import itertools
import json
import logging
import math
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import ir_measures
import numpy as np
import pandas as pd
import pyterrier as pt
from scipy import stats

from .._config import default_cache_dir
from .collection import Collection, iter_texts, load_collection, read_trec_run
from ..dime import DimeScorer, EclipseDime, KernelDime, LlmDime, MagnitudeDime, OracleDime, PrfDime, SwcDime
from .encoders import DEFAULT_ENCODER, load_encoder, resolve_encoder
from ..generate import LlmGenerator
from ..llm import LlmAnswers
from ..scorer import VectorScorer
from ..threshold import Rdime, TopK

logger = logging.getLogger(__name__)

DEFAULT_CACHE = default_cache_dir()
DEFAULT_DIMES = ('prf', 'swc', 'llm')
DEFAULT_KS = (0.4, 0.6, 0.8)
ALPHA = 0.05
ENCODE_CHUNK = 4096  # documents encoded per call when building an index


def _dime_factories(collection: Collection, model) -> Dict[str, Tuple[str, Callable[[bool], DimeScorer]]]:
    """name -> (row label, factory(keep_ranking) -> DIME scorer)."""
    return {
        'prf': ('PRF (M=2)', lambda keep: PrfDime(keep_ranking=keep)),
        'swc': ('SWC (M=10, τ=0.1)', lambda keep: SwcDime(keep_ranking=keep)),
        'llm': ('LLM', lambda keep: LlmDime(encoder=model, keep_ranking=keep)),
        'rank': ('Rank 1/i (M=10)', lambda keep: KernelDime(kernel='rank', num_docs=10, keep_ranking=keep)),
        'rbf': ('RBF (M=10, τ=0.1)', lambda keep: KernelDime(kernel='rbf', num_docs=10, keep_ranking=keep)),
        'sigmoid': ('Sigmoid (M=10, τ=0.1)', lambda keep: KernelDime(kernel='sigmoid', num_docs=10,
                                                                      keep_ranking=keep)),
        'eclipse': ('Eclipse (2+, 5−)', lambda keep: EclipseDime(keep_ranking=keep)),
        'magnitude': ('Magnitude q⊙q', lambda keep: MagnitudeDime(keep_ranking=keep)),
        'oracle': ('Oracle (qrels)', lambda keep: OracleDime(qrels=collection.qrels, keep_ranking=keep)),
    }


DIME_NAMES = ('prf', 'swc', 'llm', 'rank', 'rbf', 'sigmoid', 'eclipse', 'magnitude', 'oracle')


@dataclass
class ExperimentResult:
    """What :func:`run_experiment` measured.

    Attributes:
        measures: measure names, in table order.
        table: one row per system and measure: ``dime, threshold, system, measure, value``.
        kept: per-query kept fraction of every pruned system: ``dime, threshold, qid, kept_frac, fallback``.
        significance: ``measure, dime, comparison, p_value, p_holm, significant`` (paired t-test, Holm over the
            comparisons of a measure, alpha 0.05; a NaN p-value is not significant).
        labels: DIME name -> row label.
        notes: what the reader must know (skipped rows, relevance level, dropped queries).
        timings: seconds per phase.
    """
    measures: List[str]
    table: pd.DataFrame
    kept: pd.DataFrame
    significance: pd.DataFrame
    labels: Dict[str, str]
    settings: Dict[str, object]
    notes: List[str] = field(default_factory=list)
    timings: Dict[str, float] = field(default_factory=dict)

    def paper_table(self, measure: str) -> pd.DataFrame:
        """The paper's layout for one measure: rows DIME, columns Top-k values, RDIME (mean kept fraction) and Δ%
        of RDIME over the best Top-k; a Baseline row; † = RDIME significantly different from the best Top-k,
        ‡ = from Baseline."""
        values = self.table[self.table['measure'] == measure]
        ks = [t for t in dict.fromkeys(values['threshold']) if t.startswith('k=')]
        baseline = values.loc[values['threshold'] == 'Baseline', 'value'].iloc[0]
        rows = []
        for dime, label in self.labels.items():
            mine = values[values['dime'] == dime].set_index('threshold')['value']
            if mine.empty:
                continue
            best_k = max(ks, key=lambda k: mine[k])
            rdime = mine['RDIME']
            kept = self.kept[(self.kept['dime'] == dime) & (self.kept['threshold'] == 'RDIME')]['kept_frac'].mean()
            marks = ''.join(mark for comparison, mark in (('best Top-k', '†'), ('Baseline', '‡'))
                            if self._significant(measure, dime, comparison))
            row = {'DIME': label}
            row.update({k: f'{mine[k]:.4f}' + ('*' if k == best_k else '') for k in ks})
            row['RDIME (kept)'] = f'{rdime:.4f}{marks} ({kept:.2f})'
            row['Δ% vs best Top-k'] = f'{100 * (rdime - mine[best_k]) / mine[best_k]:+.2f}' if mine[best_k] else 'n/a'
            rows.append(row)
        rows.append({'DIME': 'Baseline', **{k: '–' for k in ks}, 'RDIME (kept)': f'{baseline:.4f} (1.00)',
                     'Δ% vs best Top-k': ''})
        return pd.DataFrame(rows)

    def _significant(self, measure: str, dime: str, comparison: str) -> bool:
        sig = self.significance
        hit = sig[(sig['measure'] == measure) & (sig['dime'] == dime) & sig['comparison'].str.startswith(comparison)]
        return bool(hit['significant'].any())

    def to_markdown(self) -> str:
        lines = [f'# RDIME vs Top-k on {self.settings["collection"]}', '',
                 f'Encoder `{self.settings["encoder"]}`, mode `{self.settings["mode"]}`, first stage '
                 f'{self.settings["first_stage"]}, '
                 f'{self.settings["num_queries"]} queries.', '']
        for measure in self.measures:
            table = self.paper_table(measure).to_markdown(index=False, disable_numparse=True)
            lines += [f'## {measure}', '', table, '']
        lines += ['`*` best Top-k of the row; `†` RDIME significantly different from that best Top-k, `‡` from '
                  f'Baseline (paired t-test, Holm-corrected per measure, α = {ALPHA}); (kept) = mean fraction of '
                  'dimensions RDIME kept per query.', '']
        lines += [f'- {note}' for note in self.notes]
        return '\n'.join(lines) + '\n'

    def save(self, out_dir: Union[str, Path]) -> Path:
        """Writes results.md, results.csv (long table), results.json, significance.csv, kept_fraction.csv and
        kept_fraction.png (boxplot of the per-query kept fraction of RDIME per DIME)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / 'results.md').write_text(self.to_markdown(), encoding='utf-8')
        self.table.to_csv(out / 'results.csv', index=False)
        self.significance.to_csv(out / 'significance.csv', index=False)
        self.kept.to_csv(out / 'kept_fraction.csv', index=False)
        payload = {'settings': self.settings, 'notes': self.notes, 'timings': self.timings,
                   'results': self.table.to_dict(orient='records'),
                   'significance': self.significance.to_dict(orient='records'),
                   'kept_fraction_mean': self.kept.groupby(['dime', 'threshold'])['kept_frac'].mean().reset_index()
                   .to_dict(orient='records')}
        (out / 'results.json').write_text(json.dumps(payload, indent=2, default=_json_default), encoding='utf-8')
        self.boxplot(out / 'kept_fraction.png')
        return out

    def boxplot(self, path: Union[str, Path]) -> None:
        # a bare Figure: no pyplot state, so the notebook's inline backend is left alone
        from matplotlib.figure import Figure
        rdime = self.kept[self.kept['threshold'] == 'RDIME']
        names = [d for d in self.labels if d in set(rdime['dime'])]
        fig = Figure(figsize=(1.6 * max(len(names), 2) + 1, 3.5))
        ax = fig.subplots()
        ax.boxplot([rdime.loc[rdime['dime'] == d, 'kept_frac'] for d in names], showmeans=True)
        ax.set_xticks(range(1, len(names) + 1), [self.labels[d] for d in names], fontsize=8)
        ax.set_ylabel('fraction of dimensions kept')
        ax.set_ylim(0, 1.02)
        ax.set_title(f'RDIME per-query kept fraction — {Path(str(self.settings["collection"])).name}, '
                     f'{Path(str(self.settings["encoder"])).name}', fontsize=9)
        fig.tight_layout()
        fig.savefig(path, dpi=120)


def _json_default(value):
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return value.item()
    return str(value)


def measures_for(collection: Collection, rel: Optional[int] = None, extra: Sequence[str] = ()) -> list:
    """nDCG@10 and AP (AP at ``rel``: 2 on graded collections, the TREC DL convention, else 1), plus ``extra``
    measures in ir_measures syntax."""
    rel = rel if rel is not None else (2 if collection.graded else 1)
    return [ir_measures.nDCG @ 10, ir_measures.AP(rel=rel)] + [ir_measures.parse_measure(m) for m in extra]


def encoder_slug(name: str) -> str:
    """A cache key of the encoder: its name and a digest of what it resolves to (local folders are often all
    called 'model')."""
    resolved = resolve_encoder(name)
    digest = hashlib.sha1(resolved.encode()).hexdigest()[:8]
    return re.sub(r'[^A-Za-z0-9_.-]+', '_', name)[-60:] + f'-{digest}'


def dense_index(collection: Collection, model, encoder_name: str, cache_dir: Union[str, Path],
                docnos: Optional[Sequence[str]] = None, *, verbose: bool = True):
    """A FlexIndex of ``collection`` encoded with ``model``, cached under ``cache_dir``. With ``docnos`` only those
    documents are needed: a cached index that holds them all is reused, otherwise only the missing ones are encoded
    and added. ``docnos=None`` needs the whole corpus."""
    from pyterrier_dr import FlexIndex
    path = Path(cache_dir) / collection.slug / f'{encoder_slug(encoder_name)}.flex'
    old_docnos: List[str] = []
    old_vecs = None
    if (path / 'pt_meta.json').is_file():
        index = FlexIndex(str(path), verbose=False)
        lookup, old_vecs, _ = index.payload()
        old_docnos = [str(d) for d in lookup.fwd[np.arange(len(index))]]
        if docnos is not None and set(docnos) <= set(old_docnos):
            return index
        if docnos is None and len(old_docnos) >= _corpus_size(collection):
            return index
    have = set(old_docnos)
    wanted = None if docnos is None else [d for d in dict.fromkeys(docnos) if d not in have]
    logger.info('encoding %s documents of %s into %s', 'all' if wanted is None else len(wanted), collection.name, path)

    def records() -> Iterator[dict]:
        """Streams the cached vectors, then the new ones in chunks, so that memory stays bounded by a chunk."""
        for docno, vec in zip(old_docnos, old_vecs if old_vecs is not None else []):
            yield {'docno': docno, 'doc_vec': np.asarray(vec)}
        new_docs = (doc for doc in iter_texts(collection, wanted) if doc['docno'] not in have)
        progress = pt.tqdm(total=None if wanted is None else len(wanted), desc='encoding documents', unit='doc',
                           disable=not verbose)
        with progress:
            for chunk in iter(lambda: list(itertools.islice(new_docs, ENCODE_CHUNK)), []):
                vecs = model.encode_docs([doc['text'] for doc in chunk])
                for doc, vec in zip(chunk, vecs):
                    yield {'docno': doc['docno'], 'doc_vec': vec}
                progress.update(len(chunk))

    start = time.time()
    tmp = path.with_name(path.name + '.tmp')
    shutil.rmtree(tmp, ignore_errors=True)
    FlexIndex(str(tmp), verbose=False).indexer(mode='overwrite').index(records())
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    logger.info('encoded the documents in %.0f s', time.time() - start)
    return FlexIndex(str(path), verbose=False)


def _corpus_size(collection: Collection) -> int:
    return sum(1 for _ in collection.docs(None))


@contextlib.contextmanager
def _native_output_silenced():
    """PISA's C++ engine writes [info] lines and progress straight to the process's stdout and stderr (its
    log_level switch is broken in pyterrier-pisa 0.4.9); errors still surface as Python exceptions."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    devnull = os.open(os.devnull, os.O_WRONLY)
    libc = ctypes.CDLL(None)
    try:
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        yield
    finally:
        libc.fflush(None)  # C stdio buffers would otherwise reach the restored descriptors
        for fd, copy in zip((1, 2), saved):
            os.dup2(copy, fd)
            os.close(copy)
        os.close(devnull)


def bm25(collection: Collection, cache_dir: Union[str, Path], depth: int) -> pt.Transformer:
    """PISA BM25 (k1 0.9, b 0.4, porter2) over the collection, the index built once under ``cache_dir``."""
    import pyterrier_pisa
    path = Path(cache_dir) / collection.slug / 'pisa'
    if not (path / 'pt_meta.json').is_file():
        tmp = path.with_name('pisa.tmp')
        shutil.rmtree(tmp, ignore_errors=True)
        logger.info('building the PISA BM25 index of %s', collection.name)
        with _native_output_silenced():
            pyterrier_pisa.PisaIndex(str(tmp), stemmer='porter2', text_field='text').index(collection.docs(None))
        shutil.rmtree(path, ignore_errors=True)
        tmp.rename(path)
    with _native_output_silenced():  # the first retriever compresses the index, loudly
        return pyterrier_pisa.PisaIndex(str(path), stemmer='porter2', text_field='text').bm25(num_results=depth)


def first_stage_results(collection: Collection, first_stage: str, depth: int, cache_dir) -> Tuple[pd.DataFrame, str]:
    """The first ranking (``qid, query, docno, score, rank``, top-``depth``) and a description of its source.

    ``first_stage``: ``'auto'`` (the collection's run if it ships one, else BM25), ``'bm25'``, or a TREC run file.
    """
    if first_stage == 'auto':
        first_stage = 'run' if collection.run is not None else 'bm25'
    if first_stage == 'bm25':
        retriever = bm25(collection, cache_dir, depth)
        with _native_output_silenced():
            results = retriever(collection.topics)
        return results[['qid', 'query', 'docno', 'score', 'rank']], f'PISA BM25 (top {depth})'
    if first_stage == 'run':
        run, source = collection.run, "the collection's run"
    elif Path(first_stage).is_file():
        run, source = read_trec_run(first_stage), str(first_stage)
    else:
        raise ValueError(f"first stage {first_stage!r} is not 'auto', 'bm25' or an existing TREC run file")
    run = run[run['rank'] < depth]
    results = run.merge(collection.topics, on='qid')
    if results.empty:
        raise ValueError(f'the first-stage run {source} shares no qid with the queries of {collection.name}')
    return results[['qid', 'query', 'docno', 'score', 'rank']], f'{source} (top {depth})'


def run_experiment(
    collection: Union[str, Collection],
    *,
    encoder: str = DEFAULT_ENCODER,
    mode: str = 'rerank',
    first_stage: str = 'auto',
    depth: int = 100,
    num_results: int = 1000,
    dimes: Sequence[str] = DEFAULT_DIMES,
    ks: Sequence[float] = DEFAULT_KS,
    rel: Optional[int] = None,
    extra_measures: Sequence[str] = (),
    cache_dir: Union[str, Path] = DEFAULT_CACHE,
    batch_size: int = 32,
    max_queries: Optional[int] = None,
    llm_generator: Optional[str] = None,
    verbose: bool = True,
) -> ExperimentResult:
    """Run the paper's grid on a collection.

    Args:
        collection: ``irds:<id>``, a collection folder, or a loaded :class:`Collection`.
        encoder: ``'minilm'`` (bundled), ``'tasb'``, ``'contriever'``, ``'ance'``, a folder or a hub id.
        mode: ``'rerank'`` (re-score the first stage's top-``depth``) or ``'retrieve'`` (full dense retrieval of
            ``num_results`` over a FlexIndex of the whole corpus; feedback from the dense ranking itself).
        first_stage: ``'auto'``, ``'bm25'`` or a TREC run file (rerank mode).
        dimes: among ``prf, swc, llm, rank, rbf, sigmoid, eclipse, magnitude, oracle``; ``llm`` is skipped, with a
            note, when the collection has no LLM answers.
        ks: Top-k fractions.
        rel: relevance level of AP (default: 2 on graded collections, 1 otherwise).
        max_queries: keep only the first queries (smoke runs).
        llm_generator: generate the LLM row's answers with :class:`LlmGenerator` instead of reading the
            collection's ``llm_answers.tsv``: ``'smollm2'`` (bundled, offline) or a Hugging Face model name or path;
            answers are cached under ``cache_dir``.
    """
    timings: Dict[str, float] = {}
    start = time.time()
    if mode not in ('rerank', 'retrieve'):
        raise ValueError(f"mode must be 'rerank' or 'retrieve', got {mode!r}")
    unknown = [d for d in dimes if d not in DIME_NAMES]
    if unknown:
        raise ValueError(f'unknown DIME {unknown}; choose among {", ".join(DIME_NAMES)}')
    ks = [TopK(k=k).k for k in ks]
    if isinstance(collection, str):
        collection = load_collection(collection)
    notes = []
    if collection.dropped_queries:
        notes.append(f'{len(collection.dropped_queries)} queries without judgments were left out.')
    topics = collection.topics if max_queries is None else collection.topics.head(max_queries)
    model = load_encoder(encoder, batch_size=batch_size, verbose=verbose)
    measures = measures_for(collection, rel, extra_measures)
    notes.append(f'AP counts documents with label ≥ {measures[1].params["rel"]} as relevant'
                 + (' (TREC DL convention for graded judgments).' if collection.graded else '.'))
    factories = _dime_factories(collection, model)
    answers = collection.answers
    if llm_generator is not None:
        start_generation = time.time()
        generator = LlmGenerator(model=None if llm_generator == 'smollm2' else llm_generator, cache=cache_dir,
                                 verbose=verbose)
        generated = generator(topics)
        answers = dict(zip(generated['qid'], generated['query_answer']))
        timings['generation'] = time.time() - start_generation
        dimes = list(dimes) + ([] if 'llm' in dimes else ['llm'])
        notes.append(f'LLM DIME answers generated by {generator!r} ({llm_generator}), not read from a file.')
    if 'llm' in dimes and answers is None:
        notes.append('LLM DIME skipped: the collection has no llm_answers.tsv.')
        dimes = [d for d in dimes if d != 'llm']
    timings['load'] = time.time() - start - timings.get('generation', 0.0)

    frames: Dict[Tuple[str, str], pd.DataFrame] = {}
    if mode == 'rerank':
        start = time.time()
        first, source = first_stage_results(collection, first_stage, depth, cache_dir)
        first = first[first['qid'].isin(set(topics['qid']))]
        timings['first_stage'] = time.time() - start
        start = time.time()
        index = dense_index(collection, model, encoder, cache_dir, first['docno'].unique(), verbose=verbose)
        timings['index'] = time.time() - start
        start = time.time()
        candidates = (model.query_encoder() >> index.vec_loader())(first)
        if answers is not None:
            candidates = LlmAnswers(answers=answers)(candidates)
        frames[('', 'Baseline')] = VectorScorer()(candidates)
        for name in dimes:
            scored = factories[name][1](True)(candidates)
            for threshold in [TopK(k=k) for k in ks] + [Rdime()]:
                frames[(name, _threshold_name(threshold))] = (threshold >> VectorScorer())(scored)
    else:
        source = f'dense retrieval (exact inner product, top {num_results})'
        start = time.time()
        index = dense_index(collection, model, encoder, cache_dir, None, verbose=verbose)
        timings['index'] = time.time() - start
        start = time.time()
        queries = model.query_encoder()(topics)
        if answers is not None:
            queries = LlmAnswers(answers=answers)(queries)
        retrieved = index.retriever(num_results=num_results)(queries)
        frames[('', 'Baseline')] = retrieved
        for name in dimes:
            scored = (index.vec_loader() >> factories[name][1](False)).compile()(retrieved)
            for threshold in [TopK(k=k) for k in ks] + [Rdime()]:
                frames[(name, _threshold_name(threshold))] = (threshold >> index.retriever(num_results=num_results))(
                    scored)
    timings['systems'] = time.time() - start

    start = time.time()
    names = [f'{dime}/{threshold}' if dime else threshold for dime, threshold in frames]
    aggregate = pt.Experiment(list(frames.values()), topics, collection.qrels, measures, names=names,
                              verbose=False)
    perquery = pt.Experiment(list(frames.values()), topics, collection.qrels, measures, names=names,
                             perquery=True, verbose=False)
    timings['evaluation'] = time.time() - start

    measure_names = [str(m) for m in measures]
    table = aggregate.melt(id_vars='name', value_vars=measure_names, var_name='measure', value_name='value')
    table.insert(0, 'threshold', table['name'].str.split('/').str[-1])
    table.insert(0, 'dime', table['name'].map(lambda n: n.split('/')[0] if '/' in n else ''))
    table = table.rename(columns={'name': 'system'})
    kept = pd.concat([_kept_fractions(frame, dime, threshold) for (dime, threshold), frame in frames.items()
                      if dime], ignore_index=True) if dimes else pd.DataFrame(
        columns=['dime', 'threshold', 'qid', 'kept_frac', 'fallback'])
    fallbacks = int(kept.loc[kept['threshold'] == 'RDIME', 'fallback'].sum()) if len(kept) else 0
    if fallbacks:
        notes.append(f'RDIME kept no dimension for {fallbacks} (DIME, query) pairs; those queries used the unpruned '
                     "query (fallback='full').")
    significance = _significance(table, perquery, dimes, measure_names)
    settings = {'collection': collection.name, 'encoder': encoder, 'mode': mode, 'first_stage': source,
                'depth': depth if mode == 'rerank' else num_results, 'num_queries': int(topics['qid'].nunique()),
                'dimes': list(dimes), 'ks': ks, 'measures': measure_names}
    return ExperimentResult(measure_names, table, kept, significance,
                            {d: factories[d][0] for d in dimes}, settings, notes, timings)


def _threshold_name(threshold) -> str:
    return f'k={threshold.k}' if isinstance(threshold, TopK) else 'RDIME'


def _kept_fractions(frame: pd.DataFrame, dime: str, threshold: str) -> pd.DataFrame:
    per_query = frame.groupby('qid', sort=False).first().reset_index()
    fallback = per_query['query_fallback'] if 'query_fallback' in per_query else False
    return pd.DataFrame({'dime': dime, 'threshold': threshold, 'qid': per_query['qid'],
                         'kept_frac': per_query['query_kept_frac'].astype(float), 'fallback': fallback})


def _significance(table: pd.DataFrame, perquery: pd.DataFrame, dimes: Sequence[str], measures: Sequence[str]):
    rows = []
    for measure in measures:
        means = table[table['measure'] == measure].set_index('system')['value']
        scores = perquery[perquery['measure'] == measure].pivot(index='qid', columns='name', values='value')
        for dime in dimes:
            topks = [s for s in means.index if s.startswith(f'{dime}/k=')]
            best = max(topks, key=lambda s: means[s])
            for comparison, other in ((f'best Top-k ({best.split("/")[1]})', best), ('Baseline', 'Baseline')):
                pair = scores[[f'{dime}/RDIME', other]].dropna()
                with np.errstate(invalid='ignore', divide='ignore'):
                    p = float(stats.ttest_rel(pair.iloc[:, 0], pair.iloc[:, 1]).pvalue) if len(pair) > 1 else math.nan
                rows.append({'measure': measure, 'dime': dime, 'comparison': comparison, 'p_value': p})
    result = pd.DataFrame(rows, columns=['measure', 'dime', 'comparison', 'p_value'])
    result['p_holm'] = result.groupby('measure')['p_value'].transform(holm) if len(result) else []
    result['significant'] = result['p_holm'] < ALPHA
    return result


def holm(p_values: pd.Series) -> pd.Series:
    """Holm–Bonferroni adjusted p-values; NaN p-values (identical systems) count as 1, never significant."""
    p = p_values.fillna(1.0).to_numpy(dtype=float)
    order = np.argsort(p, kind='stable')
    adjusted = np.minimum(1.0, np.maximum.accumulate(p[order] * (len(p) - np.arange(len(p)))))
    out = np.empty_like(adjusted)
    out[order] = adjusted
    return pd.Series(out, index=p_values.index)
