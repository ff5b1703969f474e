"""Honest Top-k comparators: the Top-k sweep over kept fractions, computed from the vectors a cell already holds,
and Top-k with k chosen by cross-validation over the queries.
"""
from typing import Callable, Dict, Sequence, Tuple

import ir_measures
import numpy as np
import pandas as pd

from .. import maths
from .._frames import group_queries, stack_vectors

#: The sweep's kept fractions, 0.1 … 1.0.
SWEEP = tuple(round(0.1 * i, 1) for i in range(1, 11))
CV_FOLDS = 5
#: Seed of the fold assignment: the same queries fall in the same folds on every run.
CV_SEED = 0
STAGE = 'Top-k sweep'
SWEEP_COLUMNS = ['dime', 'fraction', 'system', 'qid', 'measure', 'value']
CV_COLUMNS = ['dime', 'measure', 'fold', 'fraction', 'queries']


def topk_runs(scored: pd.DataFrame, fractions: Sequence[float]) -> Dict[float, pd.DataFrame]:
    """fraction -> ``qid, docno, score``: the candidates of ``scored`` re-scored by the query pruned to its Top-k
    dimensions, as ``TopK(fraction=f) >> VectorScorer()`` scores them."""
    def position(frame, first_rows, dims):
        """Each dimension's place in its query's importance order (ties: the lower index first, as TopK)."""
        importance = stack_vectors(frame, 'query_dime', first_rows, STAGE, 'qid')
        return {'': np.argsort(np.argsort(-importance, axis=1, kind='stable'), axis=1, kind='stable')}
    return {fraction: run for (_, fraction), run in _rescored(scored, fractions, [''], position).items()}


def random_runs(candidates: pd.DataFrame, fractions: Sequence[float], seeds: int
                ) -> Dict[Tuple[str, float], pd.DataFrame]:
    """``(random#<seed>, fraction) -> qid, docno, score``: the candidates re-scored on ``round(fraction · p)``
    dimensions drawn as ``SameBudget(control='random', seed=seed)`` draws them."""
    def ranks(frame, first_rows, dims):
        qids = frame['qid'].to_numpy()[first_rows]
        return {f'random#{seed}': maths.random_ranks([(seed, str(qid)) for qid in qids], dims) for seed in range(seeds)}
    return _rescored(candidates, fractions, [f'random#{seed}' for seed in range(seeds)], ranks)


def _rescored(candidates: pd.DataFrame, fractions: Sequence[float], names: Sequence[str],
              ranks: Callable) -> Dict[Tuple[str, float], pd.DataFrame]:
    """``(name, fraction) -> qid, docno, score``: the candidates re-scored on each query's dimensions whose rank
    (``ranks(candidates, first_rows, dims)``: name of ``names`` -> queries × dims) is below the fraction's count."""
    if not len(candidates):
        return {(n, f): pd.DataFrame({'qid': [], 'docno': [], 'score': []}) for n in names for f in fractions}
    candidates = candidates.reset_index(drop=True)
    groups = group_queries(candidates, STAGE)
    query_vecs = stack_vectors(candidates, 'query_vec', groups.first_rows, STAGE, 'qid')
    doc_vecs = stack_vectors(candidates, 'doc_vec', np.arange(len(candidates)), STAGE, 'docno').astype(np.float32)
    dims = query_vecs.shape[1]
    runs = {}
    for name, rank in ranks(candidates, groups.first_rows, dims).items():
        for fraction in fractions:
            pruned = maths.modulate(query_vecs, rank < maths.topk_count(dims, fraction=fraction)).astype(np.float32)
            scores = np.einsum('rp,rp->r', pruned[groups.codes], doc_vecs)
            runs[name, fraction] = pd.DataFrame({'qid': candidates['qid'], 'docno': candidates['docno'],
                                                 'score': scores})
    return runs


def evaluate_runs(runs: Dict[Tuple[str, float], pd.DataFrame], qrels: pd.DataFrame, measures: list) -> pd.DataFrame:
    """Per-query measures of ``(dime, fraction) -> run``: ``dime, fraction, system, qid, measure, value``. Every
    query of ``qrels`` is scored (0 where a run has none): pass the qrels of the queries run."""
    evaluator = ir_measures.evaluator(measures, qrels.rename(columns={'qid': 'query_id', 'docno': 'doc_id',
                                                                      'label': 'relevance'}))
    names = {measure: str(measure) for measure in measures}
    frames = []
    for (dime, fraction), run in runs.items():
        run = run.rename(columns={'qid': 'query_id', 'docno': 'doc_id'})
        rows = [(m.query_id, names[m.measure], m.value) for m in evaluator.iter_calc(run)]
        frame = pd.DataFrame(rows, columns=['qid', 'measure', 'value'])
        frames.append(frame.assign(dime=dime, fraction=fraction, system=f'{dime}/k={fraction}'))
    return pd.concat(frames, ignore_index=True)[SWEEP_COLUMNS] if frames else pd.DataFrame(columns=SWEEP_COLUMNS)


def fold_of(qids: Sequence[str], folds: int = CV_FOLDS, seed: int = CV_SEED) -> pd.Series:
    """qid -> fold in ``0 … folds-1``: the qids sorted, shuffled by ``seed`` and dealt round-robin."""
    ordered = np.array(sorted(set(map(str, qids))), dtype=object)
    shuffled = ordered[np.random.default_rng(seed).permutation(len(ordered))]
    return pd.Series(np.arange(len(shuffled)) % folds, index=shuffled, name='fold').sort_index()


def cv_topk(table: pd.DataFrame, folds: int = CV_FOLDS, seed: int = CV_SEED) -> Tuple[pd.Series, pd.DataFrame]:
    """Cross-validated Top-k for one DIME and measure, from ``table`` (a row per qid, a column per Top-k fraction) in
    ``folds`` (at least 2; one query per fold with fewer queries) dealt by :func:`fold_of` with ``seed``. Returns
    ``(values, choices)``: qid -> the value at the fraction chosen without its fold, and ``fold, fraction, queries``
    (the best mean over the other folds; ties: the smaller fraction)."""
    # pt.Experiment's per-query values can arrive as dtype object: pandas then refuses them in a float Series
    table = table.astype(float).dropna().sort_index(axis=1)
    table.index = table.index.map(str)
    if len(table) < 2:
        raise ValueError(f'cross-validated Top-k: needs at least 2 queries with every fraction measured, got '
                         f'{len(table)}; run more queries (--max-queries) or turn the sweep off (--no-sweep)')
    if folds < 2:
        raise ValueError(f'cross-validated Top-k: folds must be >= 2 (the fraction is chosen on the other folds), '
                         f'got {folds}; pass --folds 2 or more')
    fold = fold_of(table.index, min(folds, len(table)), seed).reindex(table.index).to_numpy()
    matrix = table.to_numpy()
    chosen = np.empty(len(table), dtype=int)  # per query: the column chosen without its fold
    choices = []
    for held_out in np.unique(fold):
        # the first maximum: the smaller fraction
        chosen[fold == held_out] = column = int(np.argmax(matrix[fold != held_out].mean(axis=0)))
        choices.append({'fold': int(held_out), 'fraction': float(table.columns[column]),
                        'queries': int((fold == held_out).sum())})
    values = pd.Series(matrix[np.arange(len(table)), chosen], index=table.index)
    return values, pd.DataFrame(choices)


def cv_systems(pool: pd.DataFrame, dimes: Sequence[str], folds: int = CV_FOLDS,
               seed: int = CV_SEED) -> Tuple[pd.DataFrame, pd.DataFrame]:
    """Cross-validated Top-k of each DIME and measure, from ``pool`` (``system, qid, measure, value`` of the systems
    ``<dime>/k=<fraction>``). Returns ``(perquery, choices)``: the rows of ``<dime>/CV Top-k``, and ``dime,
    measure, fold, fraction, queries``; empty for a DIME with fewer than 2 queries measured at every fraction."""
    rows, choices = [], []
    pool = pool.assign(dime=pool['system'].str.split('/').str[0],
                       fraction=pool['system'].str.split('/k=').str[1].astype(float))
    for (dime, measure), group in pool[pool['dime'].isin(dimes)].groupby(['dime', 'measure'], sort=False):
        table = group.pivot(index='qid', columns='fraction', values='value').dropna()
        if len(table) < 2:
            continue
        values, chosen = cv_topk(table, folds, seed)
        rows.append(pd.DataFrame({'system': f'{dime}/CV Top-k', 'qid': values.index, 'measure': measure,
                                  'value': values.to_numpy()}))
        choices.append(chosen.assign(dime=dime, measure=measure))
    if not rows:
        return pd.DataFrame(columns=['system', 'qid', 'measure', 'value']), pd.DataFrame(columns=CV_COLUMNS)
    return pd.concat(rows, ignore_index=True), pd.concat(choices, ignore_index=True)[CV_COLUMNS]
