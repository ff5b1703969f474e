"""The grid of systems, built from the library's stages: Baseline, and for each DIME each threshold (Top-k
fractions, RDIME and its soft modulators), in the references' protocol; each system's result frame recorded on disk as
it is finished, so that a killed cell resumes (:class:`SystemRecords`); and the LLM answers they read (``--answers``),
by source: from files, a collection folder's ``llm_answers/<name>.tsv``, or the published ones."""
import functools
import hashlib
import logging
import os
import pickle
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Hashable, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import pandas as pd
import pyterrier as pt

from .. import store
from ..dime import (
    ActiveFeedbackDime,
    EclipseDime,
    KernelDime,
    LlmDime,
    LlmEclipseDime,
    MagnitudeDime,
    OracleDime,
    PrfDime,
    SwcDime,
)
from ..llm import LlmAnswers, read_answers_csv, read_answers_tsv
from ..llm.published import CATALOGUE, fetch, published_entry
from ..threshold import CONTROLS as SELECTIONS
from ..threshold import Rdime, SameBudget, ScoreMass, TopK, VectorScorer
from .collection import Collection, slug
from .parity import random_runs, topk_runs

logger = logging.getLogger(__name__)

FEEDBACKS = ('dense', 'first-stage')
#: Soft RDIME columns the runner can add (``modulators``): name -> (column label, ``Rdime(modulator=...)``).
MODULATORS = {'james-stein': 'RDIME-JS', 'wiener': 'RDIME-Wiener'}
#: DIMEs that read no feedback ranking.
NO_FEEDBACK = ('llm', 'magnitude')
#: Same-budget controls (``--controls``): :class:`~pyterrier_rdime.SameBudget` selections, and ``vector-prf``.
CONTROLS = SELECTIONS + ('vector-prf',)
#: ``prefix`` (Matryoshka truncation) means something only for models trained for truncation: opt-in.
DEFAULT_CONTROLS = ('random', 'magnitude', 'variance', 'vector-prf')
#: The folder of a cell's progress inside its output folder: one sub-folder per cell key.
PROGRESS = '.progress'
#: A system's record key: ``(kind, name)``, kind ``'frames'``, ``'seeded'`` or ``'sweep'``.
Key = Tuple[str, Hashable]
#: The record key of the dense Baseline (:data:`Key`).
BASELINE: Key = ('frames', 'Baseline')
#: A source name as ``--answers`` takes it, and as it appears in system names (``llm@<name>``).
_NAME = re.compile(r'[A-Za-z0-9][\w.+-]*')
#: Suffixes of answer files: tab-separated, or the published CSV (Unveiling DIME's files end in .txt).
_FILE_SUFFIXES = ('.tsv', '.csv', '.txt')
#: The LLM answers of a run by source: source name -> (qid -> answer); source ``s`` makes the DIME ``llm@s``.
AnswerSources = Dict[str, Dict[str, str]]
#: Query rows per retriever call (eleven systems of DL19's 43 queries): bounds the call's result frame and heaps.
BATCH_QUERIES = 512


#: The grid's DIMEs: name -> (row label, estimator, its arguments), with the reference implementations' defaults.
DIMES = {
    'prf': ('PRF (M=2)', PrfDime, {}),
    'swc': ('SWC (M=10, τ=0.1)', SwcDime, {}),
    'llm': ('LLM', LlmDime, {}),
    'rank': ('Rank 1/i (M=10)', KernelDime, {'kernel': 'rank', 'num_docs': 10}),
    'rbf': ('RBF (M=10, τ=0.1)', KernelDime, {'kernel': 'rbf', 'num_docs': 10}),
    'sigmoid': ('Sigmoid (M=10, τ=0.1)', KernelDime, {'kernel': 'sigmoid', 'num_docs': 10}),
    'eclipse': ('Eclipse (2+, 5−)', EclipseDime, {}),
    'magnitude': ('Magnitude q⊙q', MagnitudeDime, {}),
    'oracle': ('Oracle (qrels)', OracleDime, {}),
    'llm-eclipse': ('LLM Eclipse (LLM+, 5−)', LlmEclipseDime, {}),
    'active': ('Active (1 rel.)', ActiveFeedbackDime, {}),
    'active-neg': ('Active (1 rel. − ½ non-rel.)', ActiveFeedbackDime, {'beta': 0.5}),
}
DIME_NAMES = tuple(DIMES)
#: DIMEs that read an LLM answer per query: skipped, with a note, where there are none.
NEEDS_ANSWERS = ('llm', 'llm-eclipse')
#: DIMEs that read the qrels.
NEEDS_QRELS = ('oracle', 'active', 'active-neg')


def expand_dimes(dimes: Sequence[str], answers: Optional[AnswerSources]) -> Dict[str, Tuple[str, str]]:
    """The grid's DIMEs: system name -> (DIME, answer source); those of :data:`NEEDS_ANSWERS` once per source."""
    return {f'{dime}@{source}' if source else dime: (dime, source)
            for dime in dimes for source in (list(answers or {}) if dime in NEEDS_ANSWERS else [''])}


def thresholds(ks: Sequence[float], modulators: Sequence[str], masses: Sequence[float] = ()
               ) -> Dict[str, pt.Transformer]:
    """Column name -> threshold stage: ``k=<fraction>``, ``RDIME``, the soft modulators, then ``mass=<p>``."""
    return {**{f'k={k}': TopK(fraction=k) for k in ks}, 'RDIME': Rdime(),
            **{MODULATORS[modulator]: Rdime(modulator=modulator) for modulator in modulators},
            **{f'mass={mass}': ScoreMass(mass=mass) for mass in masses}}


@dataclass
class Grid:
    """The systems' result frames (name -> frame, no vector column) and what the reader must know about them."""
    frames: Dict[str, pd.DataFrame]
    labels: Dict[str, str]
    source: str
    notes: List[str] = field(default_factory=list)
    #: (dime, fraction) -> ``qid, docno, score`` of the Top-k sweep (dime ``random#<seed>``: the random selection).
    sweep: Dict[Tuple[str, float], pd.DataFrame] = field(default_factory=dict)
    #: (system, seed) -> result frame of each seed of a ``random`` control; the system's value is their mean.
    seeded: Dict[Tuple[str, int], pd.DataFrame] = field(default_factory=dict)

    def put(self, frames: Dict[Key, pd.DataFrame]) -> None:
        """Files the systems' frames under their record keys (:data:`Key`)."""
        for key, frame in frames.items():
            getattr(self, key[0])[key[1]] = frame


def run_stage(stage: pt.Transformer, frame: pd.DataFrame, workers: int = 1, backend: str = 'joblib') -> pd.DataFrame:
    """Applies a query-level stage to a frame, serially or over ``workers`` processes (PyTerrier's ``.parallel``)."""
    if workers > 1 and len(frame):
        stage = stage.parallel(workers, backend=backend)
    return stage(frame)


def without_vectors(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` without its vector columns (``query_vec``, ``doc_vec``, …): nothing later reads one."""
    return frame.drop(columns=[c for c in frame.columns if len(frame) and frame[c].dtype == object
                               and isinstance(frame[c].iloc[0], np.ndarray)])


class SystemRecords:
    """The finished systems of one cell, each its result frame (without vectors) in a checksummed record
    (:mod:`pyterrier_rdime.store`) in ``<folder>/<key>/``, read back on the next run (a bad record is recomputed
    with a warning). Other keys' folders are removed on opening; :meth:`clear` removes the records. With
    ``folder=None`` nothing is written.

    Example::

        records = SystemRecords(cell_folder / PROGRESS, cell_key)
        frame = records.frame(('frames', 'prf/RDIME'), lambda: (Rdime() >> retriever)(scored))
    """

    def __init__(self, folder: Optional[Union[str, Path]] = None, key: str = ''):
        self.folder = Path(folder) / key if folder is not None else None
        self.read_back = 0  # systems read back rather than computed, for the log and the tests
        if folder is None:
            return
        if not key:
            raise ValueError('SystemRecords: a recording folder needs the key of the cell it records (e.g. the '
                             "grid's Cell.key)")
        for stale in (p for p in Path(folder).glob('*') if p.is_dir() and p.name != key):
            logger.info('removing the progress of an earlier run with other inputs: %s', stale)
            shutil.rmtree(stale, ignore_errors=True)

    def frame(self, key: Key, compute: Callable[[], pd.DataFrame]) -> pd.DataFrame:
        """The frame of the system ``key``: read back where recorded, else ``compute()``, recorded."""
        return self.frames([key], lambda missing: [(key, compute())])[key]

    def frames(self, keys: Sequence[Key], compute: Callable[[List[Key]], Iterable[Tuple[Key, pd.DataFrame]]]
               ) -> Dict[Key, pd.DataFrame]:
        """The frames of ``keys``, in order: the recorded ones read back, the others from ``compute(missing keys)``'s
        ``(key, frame)`` pairs, each recorded as it is yielded."""
        found = {key: frame for key in keys if (frame := self._read(key)) is not None}
        if found and not self.read_back:
            logger.info('resuming the cell: reading back the systems an interrupted run finished, from %s',
                        self.folder)
        self.read_back += len(found)
        missing = [key for key in keys if key not in found]
        for key, frame in compute(missing) if missing else ():
            if key in missing and key not in found:
                found[key] = self._write(key, without_vectors(frame))
        return {key: found[key] for key in keys}

    def clear(self) -> None:
        """Removes every record of the cell (called once the cell's results and record are written)."""
        if self.folder is not None:
            shutil.rmtree(self.folder.parent, ignore_errors=True)

    def _path(self, key: Key) -> Path:
        digest = hashlib.sha256(repr(key).encode()).hexdigest()[:12]
        return self.folder / f'{slug(f"{key[0]}-{key[1]}", digest)}.pkl'

    def _read(self, key: Key) -> Optional[pd.DataFrame]:
        if self.folder is None or not self._path(key).is_file():
            return None
        try:
            recorded_key, frame = pickle.loads(store.read_record(self._path(key), 'system-frame'))
            if recorded_key != key or not isinstance(frame, pd.DataFrame):
                raise TypeError(f'it holds no frame of {key!r}')
        except Exception as e:  # a damaged record of any kind is recomputed, never the cell aborted
            logger.warning('the record %s of %r does not read back (%s: %s); recomputing it', self._path(key), key,
                           type(e).__name__, e)
            return None
        return frame

    def _write(self, key: Key, frame: pd.DataFrame) -> pd.DataFrame:
        if self.folder is not None:  # a kill leaves the record whole or absent
            store.write_record(self._path(key), 'system-frame', pickle.dumps((key, frame), pickle.HIGHEST_PROTOCOL))
        return frame


def rerank_grid(first: pd.DataFrame, model, index, answers: Optional[AnswerSources], stages: Dict[str, pt.Transformer],
                qrels: pd.DataFrame, judged: Sequence[str], run: Callable, options, records: SystemRecords,
                answer_encoder=None) -> Grid:
    """Re-ranking: the first stage's top-``options.depth`` re-scored by the (pruned) query vector. With
    ``feedback='dense'`` (the references' protocol) the feedback documents are the top of the candidates re-scored
    with the full query vector; with ``'first-stage'`` the first stage's own top. The sweep fractions (and the
    random selection) re-score the candidates from the vectors in hand; each RDIME column gets its same-budget
    controls (:func:`dime_stages`). ``options``: the run's (:class:`~.options.Options`). Frames go through
    ``records``: read back where a run finished them. The LLM DIMEs encode the answers with ``answer_encoder``
    (default ``model``; the runner's keeps their vectors, :class:`~.encoders.AnswerVectors`)."""
    candidates = run(model.query_encoder() >> index.vec_loader(), first)
    # the feedback ranking, with its vectors, whether or not the Baseline's frame reads back
    dense = run(VectorScorer(), candidates)
    grid = Grid({'Baseline': records.frame(BASELINE, lambda: dense)}, {}, '')
    source = dense if options.feedback == 'dense' else candidates
    controls, sweep, seeds = options.controls, options.fractions, options.control_seeds
    # the vectors the variance control reads: one row per candidate document, in first-seen order
    documents = np.stack(candidates.drop_duplicates('docno')['doc_vec'].to_numpy()) if 'variance' in controls else None
    order = 'dense re-ranking (full query vector)' if options.feedback == 'dense' else 'first-stage order'
    notes = [f'Feedback documents: the top of the {order} of the top-{options.depth} candidates.']
    expanded = expand_dimes(options.dimes, answers)
    for name, (dime, answer_source) in expanded.items():
        columns = {f'{name}/{column}' for column in stages}
        scored = dime_importance(dime, (answers or {}).get(answer_source), source, candidates, model, index, qrels,
                                 judged, run, keep_ranking=True, answer_encoder=answer_encoder)
        systems = dime_stages(name, stages, controls, seeds, documents)
        # the columns over the workers; the controls here: numpy on the vectors in hand, cheaper than the round trip
        grid.put(records.frames(list(systems), lambda missing: ((key, (run if key[1] in columns else run_stage)(
            systems[key] >> VectorScorer(), scored)) for key in missing)))
        grid.put(records.frames([('sweep', (name, f)) for f in sweep], lambda missing: (
            (('sweep', (name, f)), frame) for f, frame in topk_runs(scored, [k[1][1] for k in missing]).items())))
    if 'random' in controls:
        keys = [('sweep', (f'random#{seed}', fraction)) for seed in range(seeds) for fraction in sweep]
        grid.put(records.frames(keys, lambda missing: (
            (('sweep', name), frame) for name, frame in random_runs(candidates, sweep, seeds).items())))
    if 'vector-prf' in controls:
        systems = vector_prf_queries(candidates, lambda k: source)
        grid.put(records.frames(list(systems), lambda missing: (
            (key, run(VectorScorer(), systems[key]())) for key in missing)))
    return _finished(grid, expanded, options, qrels, judged, candidates, notes, order, f'{order} of the top-'
                     f'{options.depth} candidates (the references: the bottom of a 1000-deep dense run)')


def retrieve_grid(topics: pd.DataFrame, model, index, retriever: pt.Transformer, answers: Optional[AnswerSources],
                  stages: Dict[str, pt.Transformer], qrels: pd.DataFrame, judged: Sequence[str], run: Callable, options,
                  records: SystemRecords, answer_encoder=None) -> Grid:
    """Full dense retrieval: the pruned query searches the whole index; feedback documents come from the dense ranking
    of the full query vector. ``options``, ``records`` and ``answer_encoder`` as in :func:`rerank_grid`. After the
    Baseline, the other systems are searched together (:func:`search_together`), which records each call."""
    queries = run(model.query_encoder(), topics)
    baseline = records.frame(BASELINE, lambda: run(retriever, queries))
    grid = Grid({'Baseline': baseline}, {}, f'dense retrieval ({options.retriever}, top {options.num_results})')
    # the feedback ranking: the Baseline's documents beside the full query vectors, which its frame does not hold
    retrieved = queries.merge(baseline.drop(columns=queries.columns.drop('qid'), errors='ignore'), on='qid')
    notes = [f'Feedback documents: the top of the dense ranking (full query vector, top {options.num_results}).']
    expanded = expand_dimes(options.dimes, answers)

    @functools.lru_cache(maxsize=None)
    def scored(name: str) -> pd.DataFrame:
        """The DIME's importance per query, computed on the first system that needs it."""
        dime, answer_source = expanded[name]
        return dime_importance(dime, (answers or {}).get(answer_source), retrieved, queries, model, index, qrels,
                               judged, run, keep_ranking=False, answer_encoder=answer_encoder)

    searches: Dict[Key, Callable[[], pd.DataFrame]] = {}  # system -> its query frame, in the table's order
    for name in expanded:
        searches.update({key: lambda stage=stage, name=name: run(stage, scored(name)) for key, stage in dime_stages(
            name, stages, options.controls, options.control_seeds, index, options.fractions).items()})
    if 'random' in options.controls:  # round(fraction · p) dimensions at random: MagnitudeDime >> TopK fixes the count
        searches.update({('sweep', (f'random#{seed}', fraction)): functools.partial(run, MagnitudeDime(
            keep_ranking=False) >> TopK(fraction=fraction) >> SameBudget(control='random', seed=seed), queries)
            for seed in range(options.control_seeds) for fraction in options.fractions})
    if 'vector-prf' in options.controls:
        searches.update(vector_prf_queries(queries, lambda k: run(index.vec_loader(),
                                                                  retrieved[retrieved['rank'] < k])))
    # each call's result is recorded, not each system's frame (16M rows pickled again, ~6 s of the 8.8M cell): a
    # resumed run reads the calls back and rebuilds these frames
    grid.put({key: without_vectors(frame[['qid', 'docno', 'score']] if key[0] == 'sweep' else frame)
              for key, frame in search_together(retriever, searches, run, BATCH_QUERIES, records)})
    return _finished(grid, expanded, options, qrels, judged, queries, notes, 'dense ranking',
                     f'{options.num_results}-deep dense ranking')


def dime_importance(dime: str, answers: Optional[Dict[str, str]], ranking: pd.DataFrame, queries: pd.DataFrame,
                    model, index, qrels: pd.DataFrame, judged_docnos: Sequence[str], run: Callable,
                    keep_ranking: bool, answer_encoder=None) -> pd.DataFrame:
    """The ``query_dime`` of ``dime`` (reading ``answers`` where it reads some, encoded by ``answer_encoder``, default
    ``model``) on the feedback ``ranking``: beside it in re-ranking (``keep_ranking``, where the ranking holds its
    vectors), beside ``queries`` in retrieval. Oracle DIME reads **all** judged documents of each query the index
    holds (as the references), not only the ranking's."""
    if dime == 'oracle':
        judged = qrels[qrels['qid'].isin(set(queries['qid'])) & qrels['docno'].isin(set(judged_docnos))]
        frame = queries[['qid', 'query_vec']].drop_duplicates('qid').merge(judged[['qid', 'docno']], on='qid')
        oracle = run(OracleDime(qrels=qrels, keep_ranking=False), index.vec_loader()(frame.assign(score=0.0)))
        return (ranking if keep_ranking else queries).merge(oracle[['qid', 'query_dime']], on='qid')
    _, estimator, arguments = DIMES[dime]  # given the qrels or the encoder (for the answers) it reads
    reads = {'qrels': qrels} if dime in NEEDS_QRELS else {
        'encoder': answer_encoder or model} if dime in NEEDS_ANSWERS else {}
    stage: pt.Transformer = estimator(**arguments, **reads, keep_ranking=keep_ranking)
    if not keep_ranking:
        stage, ranking = (stage, queries) if dime in NO_FEEDBACK else ((index.vec_loader() >> stage).compile(), ranking)
    return run(stage, LlmAnswers(answers=answers)(ranking) if dime in NEEDS_ANSWERS else ranking)


def search_together(retriever: pt.Transformer, queries: Dict[Hashable, Callable[[], pd.DataFrame]],
                    run: Callable[[pt.Transformer, pd.DataFrame], pd.DataFrame] = run_stage,
                    batch_queries: int = BATCH_QUERIES, records: Optional[SystemRecords] = None
                    ) -> Iterator[Tuple[Hashable, pd.DataFrame]]:
    """Yields ``(key, retriever(queries[key]()))`` for each key, in order, from calls of ``run(retriever, frame)``
    (default ``retriever(frame)``) that each hold every system's rows of as many queries (qids) as fit in
    ``batch_queries`` rows (at least one query): the kept sets of one query that extend one another (a DIME's Top-k
    sweep and RDIME, the random selections of one seed) share a call, where the one pass scores them as prefix sums.
    Every frame is built first; with ``records``, each call's result is recorded as it ends and read back by a later
    run of the same systems.

    Each row is searched under a qid of its own, then each system's result is rebuilt as the retriever builds one.
    A retriever that scores each query on its own gives the frames of one call per system bit for bit; a BLAS matrix
    product may differ in the last bits (~1e-6 relative), as with ``--workers``."""
    keys = list(queries)
    frames = [queries[key]().reset_index(drop=True) for key in keys]
    owner = np.repeat(np.arange(len(keys)), [len(frame) for frame in frames])  # each stacked row's system and row
    row = np.concatenate([np.arange(len(frame)) for frame in frames]) if keys else np.empty(0, dtype=np.int64)
    qids = np.concatenate([frame['qid'].astype(str).to_numpy() for frame in frames]) if keys else row
    vectors = np.concatenate([frame['query_vec'].to_numpy(dtype=object) for frame in frames]) if keys else row
    codes = pd.factorize(qids)[0]  # qids in order of appearance
    per_qid = np.split(np.argsort(codes, kind='stable'), np.cumsum(np.bincount(codes))[:-1]) if len(codes) else []
    calls, call = [], []
    for rows in per_qid:
        if call and sum(map(len, call)) + len(rows) > batch_queries:
            calls.append(np.concatenate(call))
            call = []
        call.append(rows)
    calls += [np.concatenate(call)] if call else []
    results, columns = [], []  # per call: its result rows and the stacked row of each; the retriever's columns

    def search(stacked: np.ndarray) -> pd.DataFrame:
        result = run(retriever, pd.DataFrame({'qid': np.arange(len(stacked)).astype(str),
                                              'query_vec': vectors[stacked]}))
        columns[:] = result.columns
        return result
    for i, stacked in enumerate(calls):
        if records is None:
            result = search(stacked)
        else:  # recorded without its vectors, under the systems searched and the call's qids
            digest = hashlib.sha256(repr((keys, sorted(set(qids[stacked])))).encode()).hexdigest()[:16]
            result = records.frame(('call', f'{i + 1}-of-{len(calls)}-{digest}'), lambda: search(stacked))
        batch_row = result['qid'].astype(np.int64).to_numpy()
        order = np.argsort(batch_row, kind='stable')  # the batch's row order: a no-op for a retriever that keeps it
        results.append((result.iloc[order].reset_index(drop=True), stacked[batch_row[order]]))
    if not results:
        return
    if not len(columns):  # every call read back: the retriever's columns from an empty call
        search(np.empty(0, dtype=np.int64))
    result = pd.concat([r for r, _ in results], ignore_index=True)
    stacked = np.concatenate([s for _, s in results])
    added = [c for c in columns if c not in ('qid', 'query_vec')]
    by_system = np.lexsort((row[stacked], owner[stacked]))  # each system's rows in its frame's order, stable
    bounds = np.searchsorted(owner[stacked][by_system], np.arange(len(keys) + 1))
    for i, (key, frame) in enumerate(zip(keys, frames)):
        take = by_system[bounds[i]:bounds[i + 1]]
        out = frame.iloc[row[stacked[take]]].reset_index(drop=True)
        if 'query_vec' not in columns:  # a retriever that drops it (drop_query_vec=True)
            out = out.drop(columns='query_vec')
        part = result.iloc[take].reset_index(drop=True)
        yield key, out.assign(**{column: part[column] for column in added})


def vector_prf_queries(queries: pd.DataFrame, feedback: Callable[[int], pd.DataFrame]
                       ) -> Dict[Key, Callable[[], pd.DataFrame]]:
    """pyterrier-dr's vector-PRF baselines with their own defaults, by record key: ``queries`` with the query vector
    the stage computes from ``feedback(k)`` (a ranking with its vectors, holding its top ``k``) in rank order."""
    from pyterrier_dr import AveragePrf, VectorPrf

    def expanded(stage: pt.Transformer) -> pd.DataFrame:
        ranked = feedback(stage.k).sort_values(['qid', 'rank'], kind='stable')
        return queries.drop(columns='query_vec').merge(stage.compile()(ranked)[['qid', 'query_vec']], on='qid')
    return {('frames', name): functools.partial(expanded, stage)
            for name, stage in (('Vector PRF', VectorPrf()), ('Average PRF', AveragePrf()))}


def dime_stages(dime: str, stages: Dict[str, pt.Transformer], controls: Sequence[str], seeds: int, documents,
                sweep: Sequence[float] = ()) -> Dict[Key, pt.Transformer]:
    """The query-level stages of ``dime``'s systems under their record keys: each column of ``stages``, the Top-k of
    each ``sweep`` fraction, then for each RDIME column (not the Top-k ones) each same-budget selection of
    ``controls`` (``random``: one per seed). ``documents`` are the vectors the variance control reads."""
    systems: Dict[Key, pt.Transformer] = {('frames', f'{dime}/{column}'): stage for column, stage in stages.items()}
    systems.update({('sweep', (dime, fraction)): TopK(fraction=fraction) for fraction in sweep})
    for column, stage in stages.items():
        if column.startswith('k='):
            continue
        for selection in (c for c in controls if c in SELECTIONS):
            system = f'{dime}/{column}:{selection}'
            if selection == 'random':
                for seed in range(seeds):
                    systems['seeded', (system, seed)] = stage >> SameBudget(control='random', seed=seed)
            else:
                systems['frames', system] = stage >> SameBudget(control=selection,
                                                                index=documents if selection == 'variance' else None)
    return systems


def _finished(grid: Grid, expanded: Dict[str, Tuple[str, str]], options, qrels: pd.DataFrame, judged: Sequence[str],
              queries: pd.DataFrame, notes: List[str], order: str, eclipse: str) -> Grid:
    """``grid`` with its systems' row labels and ``notes``, then what vector PRF (the top 3 of the ``order``), the
    oracle, Eclipse (negatives: the bottom 5 of the ``eclipse``) and active-feedback DIMEs read."""
    if 'vector-prf' in options.controls:
        notes.append(f"Vector PRF and Average PRF: pyterrier-dr's stages with their defaults (top 3 of the {order}).")
    if 'oracle' in options.dimes:
        mine = qrels[qrels['qid'].isin(set(queries['qid']))]
        used = int(mine['docno'].isin(set(judged)).sum())
        notes.append(f'Oracle DIME: correlation over every judged document of the query ({used} judgments)'
                     + (f'; {len(mine) - used} judged documents are not in the corpus/index and were left out.'
                        if used < len(mine) else '.'))
    if {'eclipse', 'llm-eclipse'} & set(options.dimes):
        notes.append(f'Eclipse negatives: the bottom 5 of the {eclipse}.')
    active = [d for d in options.dimes if d in ('active', 'active-neg')]
    if active:
        notes.append(f'{", ".join(active)}: active feedback reads the judged documents of the ranking (the '
                     'highest-labelled one, and for active-neg the lowest-labelled one); an oracle-like upper bound, '
                     'not a system a user can run.')
    grid.labels = {name: f'{DIMES[dime][0]} ({source})' if source else DIMES[dime][0]
                   for name, (dime, source) in expanded.items()}
    grid.notes = notes
    return grid


def answer_sources(spec: Optional[str], collection: Collection,
                   cache_dir: Union[str, Path]) -> AnswerSources:
    """The answers of ``--answers`` for ``collection``: source name -> (qid -> answer).

    Without ``spec``, the collection's own ``llm_answers.tsv`` as the source ``''``; a single file is the source
    ``''`` too; several items are named by the file's stem or the name. A name is read from the folder's
    ``llm_answers/<name>.tsv``, else from the published answers (:mod:`pyterrier_rdime.llm.published`). No item, a
    missing file or a malformed name is a ValueError with the fix.
    """
    if spec is None:
        return {} if collection.answers is None else {'': collection.answers}
    items = list(dict.fromkeys(item.strip() for item in spec.split(',') if item.strip()))
    if not items:
        raise ValueError(f'--answers {spec!r} names no answers; pass a qid<TAB>answer file, or names such as gpt-4 '
                         '(several: comma-separated)')
    sources: AnswerSources = {}
    for item in items:
        path = Path(item).expanduser()
        if path.is_file():
            name = '' if len(items) == 1 else re.sub(r'[^\w.+-]', '_', path.stem)
            read = read_answers_csv if path.suffix.lower() in _FILE_SUFFIXES[1:] else read_answers_tsv
            sources[name] = read(path)
        elif path.suffix.lower() in _FILE_SUFFIXES or '/' in item or os.sep in item:
            raise ValueError(f'--answers {item}: no such file; pass a qid<TAB>answer file, a name of published '
                             "answers (e.g. gpt-4), or leave --answers out to use the collection's llm_answers.tsv")
        elif not _NAME.fullmatch(item):
            raise ValueError(f'--answers {item}: no such file, nor a name of published answers (e.g. gpt-4, '
                             'qwen2.5-3b); pass a qid<TAB>answer file or a name')
        else:
            sources[item] = _by_name(item, collection, Path(cache_dir))
    return sources


def _by_name(name: str, collection: Collection, cache_dir: Path):
    if not collection.name.startswith('irds:'):
        folder = Path(collection.name) / 'llm_answers'
        local = folder / f'{name}.tsv'
        if local.is_file():
            return read_answers_tsv(local)
        offered = sorted(p.stem for p in folder.glob('*.tsv'))
        published = sorted({d for n, d in CATALOGUE if n == name})
        raise ValueError(f'--answers {name}: {collection.name} has no {local.relative_to(collection.name)}'
                         + (f' (it has {", ".join(offered)})' if offered else '')
                         + '; put the answers there (qid<TAB>answer) or pass --answers FILE'
                         + (f'; {name!r} is published for irds:{", irds:".join(published)}' if published else ''))
    return read_answers_csv(fetch(published_entry(name, collection.name), cache_dir))
