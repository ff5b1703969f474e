"""Evaluation of the grid: the measures, one per-query ``pt.Experiment``, and the paired significance tests."""
import math
from typing import Dict, Optional, Sequence, Tuple

import ir_measures
import numpy as np
import pandas as pd
import pyterrier as pt
from scipy import stats

ALPHA = 0.05
TESTS = ('t', 'wilcoxon')
DEFAULT_MEASURES = ('nDCG@10', 'AP')
#: Added by default in retrieve mode, where the ranking is deep enough (as the author's dime-library reports them).
DEEP_MEASURES = ('R@1000', 'RR@10')
#: Binary measures whose relevance level ``--rel`` sets.
BINARY = ('AP', 'R', 'RR', 'P', 'Success')


def parse_measures(names: Sequence[str], rel: Optional[int] = None) -> list:
    """ir_measures objects of ``names`` (ir_measures syntax), with ``rel`` set on the binary measures; a name that
    does not parse is a ValueError naming it."""
    if not names:
        raise ValueError('--measures: no measure given; for example --measures nDCG@10,AP')
    measures = []
    for name in names:
        try:
            measure = ir_measures.parse_measure(name)
        except Exception:
            raise ValueError(f'--measures: {name!r} is not an ir_measures measure; for example nDCG@10, AP, R@1000, '
                             'RR@10, P@10 (see https://ir-measur.es/)') from None
        if rel is not None and measure.NAME in BINARY:
            measure = measure(rel=rel)
        measures.append(measure)
    return measures


def check_rel(rel: Optional[int], qrels: pd.DataFrame) -> None:
    """Fails when no judgment reaches the relevance level ``rel`` (every binary measure would be 0)."""
    if rel is not None and not (qrels['label'] >= rel).any():
        raise ValueError(f'--rel {rel}: no judgment has a label >= {rel} (the highest is {qrels["label"].max()}), '
                         'so every binary measure would be 0; use a level the qrels reach')


def evaluate(frames: Dict[str, pd.DataFrame], topics: pd.DataFrame, qrels: pd.DataFrame,
             measures: list) -> Tuple[pd.DataFrame, pd.DataFrame]:
    """``(aggregate, perquery)``: one per-query ``pt.Experiment`` over the systems' result frames; the aggregate of
    a system is its mean over the queries (what ``pt.Experiment`` reports without ``perquery``).

    ``aggregate``: ``system, measure, value``; ``perquery``: ``system, qid, measure, value``.
    """
    perquery = pt.Experiment(list(frames.values()), topics, qrels, measures, names=list(frames), perquery=True,
                             verbose=False)
    perquery = perquery.rename(columns={'name': 'system'})
    aggregate = perquery.groupby(['system', 'measure'], sort=False)['value'].mean().reset_index()
    return aggregate, perquery


def paired_p_value(a: np.ndarray, b: np.ndarray, test: str) -> float:
    """Two-sided paired test of ``a`` against ``b``; NaN when it is undefined (identical systems, < 2 queries)."""
    if len(a) < 2 or np.array_equal(a, b):
        return math.nan
    with np.errstate(invalid='ignore', divide='ignore'):
        if test == 't':
            return float(stats.ttest_rel(a, b).pvalue)
        return float(stats.wilcoxon(a, b).pvalue)


def significance(aggregate: pd.DataFrame, perquery: pd.DataFrame, dimes: Sequence[str], columns: Sequence[str],
                 test: str = 't') -> pd.DataFrame:
    """Paired tests of each RDIME column (``RDIME`` and any soft one) of each DIME against the best Top-k of that DIME
    for the measure (``best Top-k (k=…)``), against ``Baseline``, and for a soft column against ``RDIME``; Holm
    corrected over the comparisons of a measure (statsmodels), alpha 0.05; a NaN p-value is not significant.

    Returns ``measure, dime, system, comparison, other, p_value, p_holm, significant``.
    """
    from statsmodels.stats.multitest import multipletests
    rows = []
    for measure in dict.fromkeys(aggregate['measure']):
        means = aggregate[aggregate['measure'] == measure].set_index('system')['value']
        scores = perquery[perquery['measure'] == measure].pivot(index='qid', columns='system', values='value')
        for dime in dimes:
            topks = [s for s in means.index if s.startswith(f'{dime}/k=')]
            others = [(f'best Top-k ({max(topks, key=lambda s: means[s]).split("/")[1]})',
                       max(topks, key=lambda s: means[s]))] if topks else []
            others.append(('Baseline', 'Baseline'))
            for column in columns:
                system = f'{dime}/{column}'
                for label, other in others + ([('RDIME', f'{dime}/RDIME')] if column != 'RDIME' else []):
                    pair = scores[[system, other]].dropna()
                    rows.append({'measure': measure, 'dime': dime, 'system': system, 'comparison': label,
                                 'other': other, 'p_value': paired_p_value(pair[system].to_numpy(),
                                                                           pair[other].to_numpy(), test)})
    result = pd.DataFrame(rows, columns=['measure', 'dime', 'system', 'comparison', 'other', 'p_value'])
    result['p_holm'] = np.nan
    for _, group in result.groupby('measure', sort=False):
        result.loc[group.index, 'p_holm'] = multipletests(group['p_value'].fillna(1.0), alpha=ALPHA,
                                                          method='holm')[1]
    result['significant'] = result['p_holm'] < ALPHA
    return result
