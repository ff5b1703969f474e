"""Paired comparisons of RDIME with its comparators: a significance test, Holm over the comparisons of a measure, and
an equivalence test (TOST) with a verdict in words (pt_docs/experiment.rst). scipy and statsmodels load on first use."""
import math
from typing import Dict, List, Sequence, Tuple

import numpy as np
import pandas as pd

from ..controls import CONTROLS as SELECTIONS

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


def choose_test(differences: np.ndarray, test: str) -> str:
    """``test``, or for ``'auto'`` the references' rule: the t-test unless Shapiro–Wilk rejects the normality of the
    differences at :data:`ALPHA` (and with fewer than 3, or all equal)."""
    if test != 'auto':
        return test
    if len(differences) < 3 or np.ptp(differences) == 0:
        return 't'
    from scipy import stats
    return 'wilcoxon' if stats.shapiro(differences).pvalue < ALPHA else 't'


def paired_p_value(a: np.ndarray, b: np.ndarray, test: str, alternative: str = 'two-sided') -> float:
    """p-value of the paired ``test`` of ``a`` against ``b`` (``'greater'``: ``a > b``); NaN when undefined."""
    if len(a) < 2 or np.array_equal(a, b):
        return math.nan
    from scipy import stats
    with np.errstate(invalid='ignore', divide='ignore'):
        if test == 't':
            return float(stats.ttest_rel(a, b, alternative=alternative).pvalue)
        return float(stats.wilcoxon(a, b, alternative=alternative).pvalue)


def equivalence(a: np.ndarray, b: np.ndarray, margin_abs: float) -> Dict[str, float]:
    """The mean of ``a - b`` with its 95 % t confidence interval, and the TOST p-value (``ttost_paired``) of
    equivalence within ``±margin_abs``; NaN when undefined (fewer than 2 queries, or every difference equal)."""
    differences = a - b
    n = len(differences)
    mean = float(differences.mean()) if n else math.nan
    if n < 2 or np.ptp(differences) == 0:
        return {'mean_diff': mean, 'ci_low': mean, 'ci_high': mean, 'tost_p': math.nan}
    from scipy import stats
    from statsmodels.stats.weightstats import ttost_paired
    half = stats.t.ppf(1 - ALPHA / 2, n - 1) * differences.std(ddof=1) / math.sqrt(n)
    tost_p = float(ttost_paired(a, b, -margin_abs, margin_abs)[0])
    return {'mean_diff': mean, 'ci_low': mean - half, 'ci_high': mean + half, 'tost_p': tost_p}


def verdict(differences: np.ndarray, tost_p_holm: float, p_holm: float, margin_abs: float) -> str:
    """``equivalent`` when TOST rejects a difference beyond ``±margin_abs`` (or every difference is one value inside
    it), else ``different`` when the significance test rejects equality, else ``inconclusive``."""
    if tost_p_holm < ALPHA or len(differences) and np.ptp(differences) == 0 and abs(differences[0]) < margin_abs:
        return 'equivalent'
    if p_holm < ALPHA:
        return 'different'
    return 'inconclusive'


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
    """:data:`COLUMNS`: each RDIME column of each DIME against its :func:`comparisons`, per
    measure, from ``aggregate`` (``system, measure, value``) and ``perquery`` (``system, qid, measure, value``).
    p-values are Holm-corrected per measure and family (``comparators``, ``controls``: adding controls leaves the
    comparators as they are); the margin is ``margin`` times the Baseline's mean."""
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
                    chosen = choose_test(a - b, test)
                    rows.append({'measure': measure, 'family': family, 'dime': dime, 'system': system,
                                 'comparison': label, 'other': other, 'n': len(pair), 'test': chosen,
                                 'alternative': alternative,
                                 'p_value': paired_p_value(a, b, chosen, alternative), 'margin_abs': margin_abs,
                                 **equivalence(a, b, margin_abs), '_diff': a - b})
    result = pd.DataFrame(rows, columns=COLUMNS + ['_diff'])
    families = result.groupby(['measure', 'family'], sort=False)
    result['p_holm'], result['tost_p_holm'] = families['p_value'].transform(_holm), families['tost_p'].transform(_holm)
    result['significant'] = result['p_holm'] < ALPHA
    result['verdict'] = [verdict(*args) for args in zip(result['_diff'], result['tost_p_holm'], result['p_holm'],
                                                         result['margin_abs'])]
    return result[COLUMNS].astype({'p_holm': float, 'tost_p_holm': float, 'significant': bool})
