"""RDIME against its comparators: the Top-k sweep over kept fractions (computed from the vectors a cell already holds)
and Top-k with k chosen by cross-validation over the queries; the paired comparisons: a significance test, Holm over
the comparisons of a measure, and an equivalence test (TOST) with a verdict in words (pt_docs/experiment.rst). scipy
and statsmodels load on first use."""
import math
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import ir_measures
import numpy as np
import pandas as pd

from .. import maths
from .._frames import group_queries, stack_vectors
from ..threshold import CONTROLS as SELECTIONS

ALPHA = 0.05
TESTS = ('t', 'wilcoxon', 'auto')
ALTERNATIVES = ('two-sided', 'greater', 'less')
#: Equivalence margin: a fraction of the Baseline's mean of the measure in the same cell (see ``--margin``).
DEFAULT_MARGIN = 0.05
COLUMNS = ['measure', 'family', 'dime', 'system', 'comparison', 'other', 'n', 'test', 'alternative', 'p_value',
           'p_holm', 'significant', 'mean_diff', 'ci_low', 'ci_high', 'margin_abs', 'tost_p', 'tost_p_holm', 'verdict']
#: Suffix of a same-budget control's comparison label.
SAME_BUDGET = ' (same budget)'
#: Label of the Baseline comparison when the best Top-k tuned on the test queries is k=1.0, Baseline itself.
BEST_IS_BASELINE = 'Baseline (= the best Top-k tuned on the test queries, k=1.0)'
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
    """Per-query measures of ``(dime, fraction) -> run``: ``dime, fraction, system, qid, measure, value``, the
    ``random#<seed>`` rows replaced by their mean over the seeds (dime ``random``). Every query of ``qrels`` is scored
    (0 where a run has none): pass the qrels of the queries run."""
    evaluator = qrels_evaluator(qrels, measures)
    frames = []
    for (dime, fraction), run in runs.items():
        frame = pd.DataFrame(measured(evaluator, run), columns=['qid', 'measure', 'value'])
        frames.append(frame.assign(dime=dime, fraction=fraction, system=f'{dime}/k={fraction}'))
    swept = pd.concat(frames, ignore_index=True)[SWEEP_COLUMNS] if frames else pd.DataFrame(columns=SWEEP_COLUMNS)
    seeded = swept['dime'].str.startswith('random#')
    if not seeded.any():
        return swept
    mean = swept[seeded].groupby(['fraction', 'qid', 'measure'], sort=False)['value'].mean().reset_index()
    mean = mean.assign(dime='random', system='random/k=' + mean['fraction'].astype(str))
    return pd.concat([swept[~seeded], mean[swept.columns]], ignore_index=True)


def qrels_evaluator(qrels: pd.DataFrame, measures: list):
    """ir_measures' evaluator of ``measures`` over ``qid, docno, label`` qrels: built once, it scores many runs."""
    return ir_measures.evaluator(measures, qrels.rename(columns={'qid': 'query_id', 'docno': 'doc_id',
                                                                 'label': 'relevance'}))


def measured(evaluator, run: pd.DataFrame) -> List[Tuple[str, str, float]]:
    """``(qid, measure, value)`` of a ``qid, docno, score`` run, in the order ir_measures yields them (measures named
    as ``str`` names them, as pt.Experiment does). ir_measures' evaluator holds one evaluator per provider; one that
    scores only reciprocal ranks with a cutoff gets each query's top only (:func:`top_of`): the MS MARCO provider,
    which serves RR@10, sorts every query's whole run in Python (8 of the 8.8M cell's 22 s of evaluation)."""
    by_query, out = run_dict(run), []
    for part in getattr(evaluator, 'evaluators', [evaluator]):
        depth = _top_depth(part.measures)
        scored = by_query if depth is None else {qid: top_of(docs, depth) for qid, docs in by_query.items()}
        out += [(m.query_id, str(m.measure), m.value) for m in part.iter_calc(scored)]
    return out


def _top_depth(measures) -> Optional[int]:
    """The largest cutoff of ``measures`` if each is a reciprocal rank with a cutoff over the whole ranking (not
    ``judged_only``, which skips unjudged documents and so reads below the cutoff), else None."""
    cutoffs = [m['cutoff'] for m in measures
               if m.NAME == 'RR' and 'cutoff' in m.params and not m.params.get('judged_only', False)]
    return max(cutoffs) if cutoffs and len(cutoffs) == len(measures) else None


def top_of(scores: Dict[str, float], depth: int) -> Dict[str, float]:
    """The documents of ``docno -> score`` scoring at least its ``depth``-th best score: whatever order a provider
    gives tied documents, its first ``depth`` are among them."""
    values = np.fromiter(scores.values(), dtype=float, count=len(scores))
    if len(scores) <= depth or np.isnan(values).any():  # NaN: whatever the provider makes of it, on the whole run
        return scores
    docnos = list(scores)
    kept = np.flatnonzero(values >= np.partition(values, len(values) - depth)[len(values) - depth])
    return {docnos[i]: scores[docnos[i]] for i in kept}


def run_dict(run: pd.DataFrame) -> Dict[str, Dict[str, float]]:
    """``qid -> docno -> score`` of a ``qid, docno, score`` frame, in its row order, as ir_measures reads a frame (a
    repeated docno keeps its last score), built query by query rather than row by row."""
    qids = run['qid'].to_numpy(dtype=object)
    order = np.argsort(pd.factorize(qids)[0], kind='stable')  # each query's rows together, in their order
    qids, scores = qids[order], run['score'].to_numpy(dtype=float)[order].tolist()
    docnos = run['docno'].to_numpy(dtype=object)[order].tolist()
    bounds = np.flatnonzero(np.r_[True, qids[1:] != qids[:-1], True]) if len(qids) else []
    return {qids[a]: dict(zip(docnos[a:b], scores[a:b])) for a, b in zip(bounds[:-1], bounds[1:])}


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


def choose_test(differences: np.ndarray, test: str) -> str:
    """``test``, or for ``'auto'`` the references' rule: the t-test unless Shapiro–Wilk rejects the normality of the
    differences at :data:`ALPHA` (and with fewer than 3, or all equal)."""
    if test != 'auto':
        return test
    if len(differences) < 3 or np.ptp(differences) == 0:
        return 't'
    from scipy import stats
    return 'wilcoxon' if stats.shapiro(differences).pvalue < ALPHA else 't'


def paired(a: np.ndarray, b: np.ndarray, test: str, alternative: str, margin_abs: float) -> Dict[str, object]:
    """``test`` (:func:`choose_test`) of ``a`` against ``b`` and its p-value (``'greater'``: ``a > b``), the mean of
    ``a - b`` with its 95 % t confidence interval, and the TOST p-value (``ttost_paired``) of equivalence within
    ``±margin_abs``; NaN when undefined (fewer than 2 queries, or every difference equal: no p-value if all are 0)."""
    differences = a - b
    n = len(differences)
    mean = float(differences.mean()) if n else math.nan
    row = {'test': choose_test(differences, test), 'p_value': math.nan, 'mean_diff': mean, 'ci_low': mean,
           'ci_high': mean, 'tost_p': math.nan}
    if n < 2 or np.array_equal(a, b):
        return row
    from scipy import stats
    with np.errstate(invalid='ignore', divide='ignore'):
        row['p_value'] = float((stats.ttest_rel if row['test'] == 't' else stats.wilcoxon)(
            a, b, alternative=alternative).pvalue)
    if np.ptp(differences) > 0:
        from statsmodels.stats.weightstats import ttost_paired
        half = stats.t.ppf(1 - ALPHA / 2, n - 1) * differences.std(ddof=1) / math.sqrt(n)
        row.update(ci_low=mean - half, ci_high=mean + half,
                   tost_p=float(ttost_paired(a, b, -margin_abs, margin_abs)[0]))
    return row


def verdict(differences: np.ndarray, tost_p_holm: float, p_holm: float, margin_abs: float) -> str:
    """``equivalent`` when TOST rejects a difference beyond ``±margin_abs`` (or every difference is one value inside
    it), else ``different`` when the significance test rejects equality, else ``inconclusive``."""
    one_inside = len(differences) and np.ptp(differences) == 0 and abs(differences[0]) < margin_abs
    return 'equivalent' if tost_p_holm < ALPHA or one_inside else 'different' if p_holm < ALPHA else 'inconclusive'


def _holm(p_values: pd.Series) -> np.ndarray:
    """Holm-corrected ``p_values`` (NaN counts as 1). ``multipletests`` runs ``gc.collect()``, 0.1–1 s beside torch
    and PyTerrier: the objects that exist are frozen meanwhile."""
    import gc

    from statsmodels.stats.multitest import multipletests
    gc.freeze()
    try:
        return multipletests(p_values.fillna(1.0).to_numpy(float), alpha=ALPHA, method='holm')[1]
    finally:
        gc.unfreeze()


def comparisons(means: pd.Series, dime: str, column: str) -> List[Tuple[str, str, str]]:
    """(family, label, system) of the comparisons of ``<dime>/<column>``: the comparators (CV Top-k, the best Top-k
    tuned on the test queries, Baseline (once, as :data:`BEST_IS_BASELINE`, when the best Top-k is k=1.0), and RDIME
    for a soft one), then the controls present (the same-budget ones, then vector PRF)."""
    topks = [s for s in means.index if s.startswith(f'{dime}/k=')]
    pairs = [('CV Top-k', f'{dime}/CV Top-k')] if f'{dime}/CV Top-k' in means.index else []
    best = max(topks, key=lambda s: (means[s], -float(s.split('=')[1]))) if topks else None
    best_is_baseline = best is not None and float(best.split('=')[1]) == 1
    if best is not None and not best_is_baseline:
        pairs.append((f'best Top-k ({best.split("/")[1]}, tuned on the test queries)', best))
    pairs.append((BEST_IS_BASELINE if best_is_baseline else 'Baseline', 'Baseline'))
    if column != 'RDIME':
        pairs.append(('RDIME', f'{dime}/RDIME'))
    present = [f'{dime}/{column}:{selection}' for selection in SELECTIONS]
    controls = [(s.split(':')[-1] + SAME_BUDGET, s) for s in present if s in means.index]
    controls += [(s, s) for s in ('Vector PRF', 'Average PRF') if s in means.index]
    return [('comparators', *pair) for pair in pairs] + [('controls', *pair) for pair in controls]


def significance(aggregate: pd.DataFrame, perquery: pd.DataFrame, dimes: Sequence[str], columns: Sequence[str],
                 test: str = 't', alternative: str = 'two-sided', margin: float = DEFAULT_MARGIN) -> pd.DataFrame:
    """:data:`COLUMNS`: each RDIME column of each DIME against its :func:`comparisons`, per measure, from
    ``aggregate`` (``system, measure, value``) and ``perquery`` (``system, qid, measure, value``). p-values are
    Holm-corrected per measure and family (``comparators``, ``controls``: adding controls leaves the comparators as
    they are); the margin is ``margin`` times the Baseline's mean."""
    rows = []
    for measure in dict.fromkeys(aggregate['measure']):
        means = aggregate[aggregate['measure'] == measure].set_index('system')['value']
        # pt.Experiment's per-query values can arrive as dtype object, which scipy's tests reject
        scores = perquery[perquery['measure'] == measure].pivot(index='qid', columns='system',
                                                                values='value').astype(float)
        margin_abs = margin * abs(float(means['Baseline']))
        for dime in dimes:
            for column in columns:
                system = f'{dime}/{column}'
                for family, label, other in comparisons(means, dime, column):
                    pair = scores[[system, other]].dropna()
                    a, b = pair[system].to_numpy(), pair[other].to_numpy()
                    rows.append({'measure': measure, 'family': family, 'dime': dime, 'system': system,
                                 'comparison': label, 'other': other, 'n': len(pair), 'alternative': alternative,
                                 'margin_abs': margin_abs, **paired(a, b, test, alternative, margin_abs),
                                 '_diff': a - b})
    result = pd.DataFrame(rows, columns=COLUMNS + ['_diff'])
    families = result.groupby(['measure', 'family'], sort=False)
    result['p_holm'], result['tost_p_holm'] = families['p_value'].transform(_holm), families['tost_p'].transform(_holm)
    result['significant'] = result['p_holm'] < ALPHA
    result['verdict'] = [verdict(*args) for args in zip(result['_diff'], result['tost_p_holm'], result['p_holm'],
                                                         result['margin_abs'])]
    return result[COLUMNS].astype({'p_holm': float, 'tost_p_holm': float, 'significant': bool})
