"""The grid of systems, built from the library's stages: Baseline, and for each DIME each threshold (Top-k
fractions, RDIME and its soft modulators), in the references' protocol."""
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import pandas as pd
import pyterrier as pt

from ..controls import CONTROLS as SELECTIONS
from ..controls import SameBudget
from ..dime import (
    ActiveFeedbackDime,
    DimeScorer,
    EclipseDime,
    KernelDime,
    LlmDime,
    LlmEclipseDime,
    MagnitudeDime,
    OracleDime,
    PrfDime,
    SwcDime,
)
from ..llm import LlmAnswers
from ..scorer import VectorScorer
from ..threshold import Rdime, ScoreMass, TopK
from .sweep import random_runs, topk_runs

FEEDBACKS = ('dense', 'first-stage')
#: Soft RDIME columns the runner can add (``modulators``): name -> (column label, ``Rdime(modulator=...)``).
MODULATORS = {'james-stein': 'RDIME-JS', 'wiener': 'RDIME-Wiener'}
#: DIMEs that read no feedback ranking.
NO_FEEDBACK = ('llm', 'magnitude')
#: Same-budget controls (``--controls``): which dimensions :class:`~pyterrier_rdime.SameBudget` keeps instead of
#: DIME's, at the count each RDIME column kept; ``vector-prf`` adds pyterrier-dr's vector-PRF baselines on the same
#: feedback documents.
CONTROLS = SELECTIONS + ('vector-prf',)
#: ``prefix`` (Matryoshka truncation) means something only for models trained for truncation: opt-in.
DEFAULT_CONTROLS = ('random', 'magnitude', 'variance', 'vector-prf')
VECTOR_PRF = ('Vector PRF', 'Average PRF')


def vector_prf_stages() -> Dict[str, pt.Transformer]:
    """pyterrier-dr's vector-PRF baselines with their own defaults (Rocchio, ``q + 0.2 · mean of the top 3``; Average,
    the mean of ``q`` and the top 3), by system name; each turns a ranking into one query vector per query."""
    from pyterrier_dr import AveragePrf, VectorPrf
    return dict(zip(VECTOR_PRF, (VectorPrf(), AveragePrf())))


def vector_prf_queries(stage: pt.Transformer, feedback: pd.DataFrame) -> pd.DataFrame:
    """``qid, query_vec``: ``stage`` applied to the ranking ``feedback`` in rank order (pyterrier-dr's PRF stages take
    the first rows of each query as its top documents)."""
    ranked = feedback.sort_values(['qid', 'rank'], kind='stable')
    return stage.compile()(ranked)[['qid', 'query_vec']]


def dime_factories(qrels: pd.DataFrame, model) -> Dict[str, Tuple[str, Callable[[bool], DimeScorer]]]:
    """name -> (row label, factory(keep_ranking) -> DIME scorer), with the reference implementations' defaults."""
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
        'oracle': ('Oracle (qrels)', lambda keep: OracleDime(qrels=qrels, keep_ranking=keep)),
        'llm-eclipse': ('LLM Eclipse (LLM+, 5−)', lambda keep: LlmEclipseDime(encoder=model, keep_ranking=keep)),
        'active': ('Active (1 rel.)', lambda keep: ActiveFeedbackDime(qrels=qrels, keep_ranking=keep)),
        'active-neg': ('Active (1 rel. − ½ non-rel.)', lambda keep: ActiveFeedbackDime(qrels=qrels, beta=0.5,
                                                                                        keep_ranking=keep)),
    }


DIME_NAMES = ('prf', 'swc', 'llm', 'rank', 'rbf', 'sigmoid', 'eclipse', 'magnitude', 'oracle', 'llm-eclipse', 'active',
              'active-neg')
#: DIMEs that read an LLM answer per query: skipped, with a note, where there are none.
NEEDS_ANSWERS = ('llm', 'llm-eclipse')


def thresholds(ks: Sequence[float], modulators: Sequence[str], masses: Sequence[float] = ()
               ) -> Dict[str, pt.Transformer]:
    """Column name -> threshold stage: ``k=<fraction>`` Top-k columns, ``RDIME``, the soft modulators, then the
    score-mass columns ``mass=<p>``."""
    stages: Dict[str, pt.Transformer] = {f'k={k}': TopK(fraction=k) for k in ks}
    stages['RDIME'] = Rdime()
    for modulator in modulators:
        stages[MODULATORS[modulator]] = Rdime(modulator=modulator)
    for mass in masses:
        stages[f'mass={mass}'] = ScoreMass(mass=mass)
    return stages


@dataclass
class Grid:
    """The systems' result frames (name -> frame; ``Baseline``, ``<dime>/<threshold>``) and what the reader must
    know about how they were made."""
    frames: Dict[str, pd.DataFrame]
    labels: Dict[str, str]
    source: str
    notes: List[str] = field(default_factory=list)
    #: (dime, fraction) -> ``qid, docno, score`` of the Top-k sweep (dime ``random#<seed>``: the random selection).
    sweep: Dict[Tuple[str, float], pd.DataFrame] = field(default_factory=dict)
    #: (system, seed) -> result frame of each seed of a ``random`` control; the system's value is their mean.
    seeded: Dict[Tuple[str, int], pd.DataFrame] = field(default_factory=dict)


@dataclass
class Runner:
    """Applies a stage to a frame, serially or spread over ``workers`` processes by PyTerrier's ``.parallel``
    (``backend`` ``'joblib'`` or ``'ray'``); only query-level work goes through it."""
    workers: int = 1
    backend: str = 'joblib'

    def __call__(self, stage: pt.Transformer, frame: pd.DataFrame) -> pd.DataFrame:
        if self.workers > 1 and len(frame):
            stage = stage.parallel(self.workers, backend=self.backend)
        return stage(frame)


def oracle_importance(qrels: pd.DataFrame, judged_docnos: Sequence[str], queries: pd.DataFrame,
                      vec_loader: pt.Transformer, run: Runner) -> pd.DataFrame:
    """``qid, query_dime`` of Oracle DIME over **all** judged documents of each query (every qrels entry whose
    document is in ``judged_docnos``, the ones the index holds), as the references compute it, not only the judged
    documents of the ranking."""
    judged = qrels[qrels['qid'].isin(set(queries['qid'])) & qrels['docno'].isin(set(judged_docnos))]
    frame = queries[['qid', 'query_vec']].drop_duplicates('qid').merge(judged[['qid', 'docno']], on='qid')
    frame = vec_loader(frame.assign(score=0.0))
    scored = run(OracleDime(qrels=qrels, keep_ranking=False), frame)
    return scored[['qid', 'query_dime']]


def rerank_grid(first: pd.DataFrame, model, index, answers: Optional[Dict[str, str]], dimes: Sequence[str],
                stages: Dict[str, pt.Transformer], qrels: pd.DataFrame, judged: Sequence[str], feedback: str,
                depth: int, run: Runner, sweep: Sequence[float] = (), controls: Sequence[str] = (),
                seeds: int = 1) -> Grid:
    """Re-ranking: the first stage's top-``depth`` re-scored by the (pruned) query vector. With
    ``feedback='dense'`` (the references' protocol) the DIME feedback documents are the top of the candidates
    re-scored with the full query vector; with ``'first-stage'`` the top of the first stage's own order. The Top-k
    ``sweep`` fractions re-score the same candidates from the vectors in hand, and so does the random selection at
    each fraction (``seeds`` seeds) when ``controls`` holds ``random``. Each RDIME column gets its same-budget
    ``controls`` (:func:`control_systems`), and ``vector-prf`` pyterrier-dr's vector-PRF systems on the DIMEs'
    feedback documents."""
    candidates = run(model.query_encoder() >> index.vec_loader(), first)
    if answers is not None:
        candidates = LlmAnswers(answers=answers)(candidates)
    dense = run(VectorScorer(), candidates)
    frames = {'Baseline': dense}
    source = dense if feedback == 'dense' else candidates
    factories = dime_factories(qrels, model)
    order = 'dense re-ranking (full query vector)' if feedback == 'dense' else 'first-stage order'
    notes = [f'Feedback documents: the top of the {order} of the top-{depth} candidates.']
    runs, seeded = {}, {}
    for name in dimes:
        if name == 'oracle':
            scored = source.merge(oracle_importance(qrels, judged, candidates, index.vec_loader(), run), on='qid')
        else:
            scored = run(factories[name][1](True), source)
        for column, stage in stages.items():
            frames[f'{name}/{column}'] = run(stage >> VectorScorer(), scored)
        runs.update({(name, fraction): frame for fraction, frame in topk_runs(scored, sweep).items()})
        # numpy on the vectors in hand, cheaper than a round trip through the workers
        control_systems(frames, seeded, name, stages, controls, seeds, index,
                        lambda stage: (stage >> VectorScorer())(scored))
    if 'random' in controls:
        runs.update(random_runs(candidates, sweep, seeds))
    if 'vector-prf' in controls:
        for system, stage in vector_prf_stages().items():
            queries = vector_prf_queries(stage, source)
            frames[system] = run(VectorScorer(), candidates.drop(columns='query_vec').merge(queries, on='qid'))
        notes.append(f'Vector PRF and Average PRF: pyterrier-dr\'s stages with their defaults (top 3 of the {order}).')
    notes += _oracle_notes(dimes, qrels, judged, candidates)
    if {'eclipse', 'llm-eclipse'} & set(dimes):
        notes.append(f'Eclipse negatives: the bottom 5 of the {order} of the top-{depth} candidates (the references: '
                     'the bottom of a 1000-deep dense run).')
    notes += _qrels_notes(dimes)
    return Grid(frames, {d: factories[d][0] for d in dimes}, '', notes, runs, seeded)


def retrieve_grid(topics: pd.DataFrame, model, index, retriever: pt.Transformer, backend: str,
                  answers: Optional[Dict[str, str]], dimes: Sequence[str], stages: Dict[str, pt.Transformer],
                  qrels: pd.DataFrame, judged: Sequence[str], num_results: int, run: Runner,
                  sweep: Sequence[float] = (), controls: Sequence[str] = (), seeds: int = 1) -> Grid:
    """Full dense retrieval: the pruned query searches the whole index; feedback documents come from the dense
    ranking of the full query vector (as in every reference). Each Top-k ``sweep`` fraction is one more search, and
    so is each seed of the random selection at each fraction. The ``controls`` as in :func:`rerank_grid`."""
    queries = run(model.query_encoder(), topics)
    if answers is not None:
        queries = LlmAnswers(answers=answers)(queries)
    retrieved = run(retriever, queries)
    frames = {'Baseline': retrieved}
    factories = dime_factories(qrels, model)
    notes = [f'Feedback documents: the top of the dense ranking (full query vector, top {num_results}).']
    runs, seeded = {}, {}
    for name in dimes:
        if name == 'oracle':
            scored = queries.merge(oracle_importance(qrels, judged, queries, index.vec_loader(), run), on='qid')
        elif name in NO_FEEDBACK:
            scored = run(factories[name][1](False), queries)
        else:
            scored = run((index.vec_loader() >> factories[name][1](False)).compile(), retrieved)
        for column, stage in stages.items():
            frames[f'{name}/{column}'] = run(stage >> retriever, scored)
        for fraction in sweep:
            runs[name, fraction] = run(TopK(fraction=fraction) >> retriever, scored)[['qid', 'docno', 'score']]
        control_systems(frames, seeded, name, stages, controls, seeds, index, lambda stage: run(stage >> retriever,
                                                                                                   scored))
    if 'random' in controls:
        runs.update(random_curve(lambda stage: run(stage >> retriever, queries), sweep, seeds))
    if 'vector-prf' in controls:
        for system, stage in vector_prf_stages().items():
            top = run(index.vec_loader(), retrieved[retrieved['rank'] < stage.k])
            frames[system] = run(retriever, queries.drop(columns='query_vec').merge(vector_prf_queries(stage, top),
                                                                                     on='qid'))
        notes.append("Vector PRF and Average PRF: pyterrier-dr's stages with their defaults (top 3 of the dense "
                     'ranking).')
    notes += _oracle_notes(dimes, qrels, judged, queries)
    if {'eclipse', 'llm-eclipse'} & set(dimes):
        notes.append(f'Eclipse negatives: the bottom 5 of the {num_results}-deep dense ranking.')
    notes += _qrels_notes(dimes)
    return Grid(frames, {d: factories[d][0] for d in dimes}, f'dense retrieval ({backend}, top {num_results})',
                notes, runs, seeded)


def control_systems(frames: Dict[str, pd.DataFrame], seeded: Dict[Tuple[str, int], pd.DataFrame], dime: str,
                    stages: Dict[str, pt.Transformer], controls: Sequence[str], seeds: int, index,
                    search: Callable[[pt.Transformer], pd.DataFrame]) -> None:
    """Adds, for each RDIME column of ``dime`` (not the Top-k ones), each same-budget selection of ``controls``:
    ``<dime>/<column>:<selection>`` into ``frames``, and for ``random`` one frame per seed into ``seeded``.
    ``search(stage)`` runs the threshold-and-control ``stage`` on the DIME's scored frame and ranks."""
    for column, stage in stages.items():
        if column.startswith('k='):
            continue
        for selection in (c for c in controls if c in SELECTIONS):
            system = f'{dime}/{column}:{selection}'
            if selection == 'random':
                for seed in range(seeds):
                    seeded[system, seed] = search(stage >> SameBudget(control='random', seed=seed))
            else:
                frames[system] = search(stage >> SameBudget(control=selection,
                                                            index=index if selection == 'variance' else None))


def random_curve(search: Callable[[pt.Transformer], pd.DataFrame], fractions: Sequence[float], seeds: int
                 ) -> Dict[Tuple[str, float], pd.DataFrame]:
    """``(random#<seed>, fraction) -> qid, docno, score``: the query on ``round(fraction · p)`` dimensions chosen at
    random, for each seed, searched by ``search(stage)`` (retrieve mode; re-ranking uses
    :func:`~.sweep.random_runs` on the vectors in hand). ``MagnitudeDime >> TopK`` only fixes the count;
    ``SameBudget('random')`` chooses which."""
    return {(f'random#{seed}', fraction):
            search(MagnitudeDime(keep_ranking=False) >> TopK(fraction=fraction)
                   >> SameBudget(control='random', seed=seed))[['qid', 'docno', 'score']]
            for seed in range(seeds) for fraction in fractions}


def _qrels_notes(dimes: Sequence[str]) -> List[str]:
    active = [d for d in dimes if d in ('active', 'active-neg')]
    return [f'{", ".join(active)}: active feedback reads the judged documents of the ranking (the highest-labelled '
            'one, and for active-neg the lowest-labelled one); an oracle-like upper bound, not a system a user can '
            'run.'] if active else []


def _oracle_notes(dimes: Sequence[str], qrels: pd.DataFrame, judged: Sequence[str], queries: pd.DataFrame) -> list:
    if 'oracle' not in dimes:
        return []
    mine = qrels[qrels['qid'].isin(set(queries['qid']))]
    used = int(mine['docno'].isin(set(judged)).sum())
    return [f'Oracle DIME: correlation over every judged document of the query ({used} judgments)'
            + (f'; {len(mine) - used} judged documents are not in the corpus/index and were left out.'
               if used < len(mine) else '.')]
