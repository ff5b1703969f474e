"""Paired comparisons of RDIME with its comparators: a significance test (chosen per comparison as the reference
implementations do, or fixed), Holm over the comparisons of a measure, and parity read as an equivalence test (TOST)
with a verdict in words.

scipy and statsmodels load when a comparison is made, not when the runner is imported.
"""
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
VERDICTS = ('equivalent', 'different', 'inconclusive')
COLUMNS = ['measure', 'family', 'dime', 'system', 'comparison', 'other', 'n', 'test', 'alternative', 'p_value',
           'p_holm', 'significant', 'mean_diff', 'ci_low', 'ci_high', 'margin_abs', 'tost_p', 'tost_p_holm', 'verdict']
#: The two families of comparisons, each Holm-corrected on its own per measure: RDIME against the Top-k comparators
#: and Baseline (the paper's question), and against the same-budget controls and vector PRF (does DIME's choice of
#: dimensions matter?). Adding controls thus leaves the first family's p-values as they were.
FAMILIES = ('comparators', 'controls')
#: Suffix of a same-budget control's comparison label.
SAME_BUDGET = ' (same budget)'
#: Label of the Baseline comparison when the best Top-k tuned on the test queries keeps every dimension (k=1.0): the
#: same system as Baseline, compared once, under this label.
BEST_IS_BASELINE = 'Baseline (= the best Top-k tuned on the test queries, k=1.0)'


def choose_test(differences: np.ndarray, test: str) -> str:
    """``'t'`` or ``'wilcoxon'``: ``test`` itself, or for ``'auto'`` the references' rule: Shapiro–Wilk on the
    paired differences, the t-test unless normality is rejected at :data:`ALPHA` (fewer than 3 differences, or all
    equal: the t-test)."""
    if test != 'auto':
        return test
    if len(differences) < 3 or np.ptp(differences) == 0:
        return 't'
    from scipy import stats
    return 'wilcoxon' if stats.shapiro(differences).pvalue < ALPHA else 't'


def paired_p_value(a: np.ndarray, b: np.ndarray, test: str, alternative: str = 'two-sided') -> float:
    """p-value of the paired ``test`` (``'t'`` or ``'wilcoxon'``) of ``a`` against ``b`` (``alternative``:
    ``'greater'`` means ``a > b``); NaN when it is undefined (identical systems, fewer than 2 queries)."""
    if len(a) < 2 or np.array_equal(a, b):
        return math.nan
    from scipy import stats
    with np.errstate(invalid='ignore', divide='ignore'):
        if test == 't':
            return float(stats.ttest_rel(a, b, alternative=alternative).pvalue)
        return float(stats.wilcoxon(a, b, alternative=alternative).pvalue)


def equivalence(a: np.ndarray, b: np.ndarray, margin_abs: float) -> Dict[str, float]:
    """The paired mean difference ``a - b`` with its 95 % t confidence interval, and the TOST p-value of
    statsmodels' ``ttost_paired`` for equivalence within ``±margin_abs`` (in the measure's units; NaN when undefined:
    fewer than 2 queries, or every difference equal)."""
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
    """``equivalent`` when TOST rejects a difference beyond ``±margin_abs`` (Holm-corrected p < alpha), or every
    difference is the same and inside the margin; else ``different`` when the significance test rejects equality
    (Holm-corrected p < alpha; with a one-sided ``alternative``, in that direction); else ``inconclusive``: the data
    cannot tell (too few queries, or too much spread)."""
    if len(differences) and np.ptp(differences) == 0 and abs(differences[0]) < margin_abs:
        return 'equivalent'
    if tost_p_holm < ALPHA:
        return 'equivalent'
    if p_holm < ALPHA:
        return 'different'
    return 'inconclusive'


def _holm(p_values: pd.Series) -> np.ndarray:
    """Holm-corrected ``p_values`` (statsmodels; NaN counts as 1). ``multipletests`` runs ``gc.collect()`` on every
    Holm call, a full collection that takes 0.1–1 s in a process holding torch and PyTerrier; the objects that
    exist already are frozen meanwhile, so that it only visits the few made here."""
    import gc

    from statsmodels.stats.multitest import multipletests
    gc.freeze()
    try:
        return multipletests(p_values.fillna(1.0).to_numpy(float), alpha=ALPHA, method='holm')[1]
    finally:
        gc.unfreeze()


def controls(means: pd.Series, dime: str, column: str) -> List[Tuple[str, str]]:
    """(label, system) of the controls of ``<dime>/<column>`` present: each same-budget selection
    ``<dime>/<column>:<selection>`` (label ``<selection> (same budget)``), then the vector-PRF systems."""
    present = [f'{dime}/{column}:{selection}' for selection in SELECTIONS]
    pairs = [(s.split(':')[-1] + SAME_BUDGET, s) for s in present if s in means.index]
    return pairs + [(s, s) for s in ('Vector PRF', 'Average PRF') if s in means.index]


def comparators(means: pd.Series, dime: str, column: str) -> List[Tuple[str, str]]:
    """(label, system) of the comparisons of ``<dime>/<column>``: CV Top-k, the best Top-k tuned on the test
    queries, Baseline, and for a soft RDIME column RDIME itself. A best Top-k of k=1.0 keeps every dimension: it is
    Baseline, compared once as :data:`BEST_IS_BASELINE` (twice, it would count one comparison twice in Holm's
    family)."""
    topks = [s for s in means.index if s.startswith(f'{dime}/k=')]
    pairs = [('CV Top-k', f'{dime}/CV Top-k')] if f'{dime}/CV Top-k' in means.index else []
    best = max(topks, key=lambda s: (means[s], -float(s.split('=')[1]))) if topks else None
    best_is_baseline = best is not None and float(best.split('=')[1]) == 1
    if best is not None and not best_is_baseline:
        pairs.append((f'best Top-k ({best.split("/")[1]}, tuned on the test queries)', best))
    pairs.append((BEST_IS_BASELINE if best_is_baseline else 'Baseline', 'Baseline'))
    if column != 'RDIME':
        pairs.append(('RDIME', f'{dime}/RDIME'))
    return pairs


def significance(aggregate: pd.DataFrame, perquery: pd.DataFrame, dimes: Sequence[str], columns: Sequence[str],
                 test: str = 't', alternative: str = 'two-sided', margin: float = DEFAULT_MARGIN) -> pd.DataFrame:
    """Each RDIME column (``RDIME`` and any soft one) of each DIME against its :func:`comparators` and its
    :func:`controls`, per measure.

    ``aggregate`` (``system, measure, value``) and ``perquery`` (``system, qid, measure, value``) hold every system,
    Top-k sweep points and ``<dime>/CV Top-k`` included. The significance test is ``test`` (``'auto'`` chooses per
    comparison) with ``alternative``; its p-values and TOST's are Holm-corrected over the comparisons of a measure
    (statsmodels), each of the :data:`FAMILIES` on its own. The equivalence margin is ``margin`` (a fraction) times the
    Baseline's mean of the measure: each row's ``margin_abs``, in the measure's units. Returns :data:`COLUMNS`;
    ``significant`` and the verdict read the Holm-corrected p-values at :data:`ALPHA`.
    """
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
                compared = [('comparators', pair) for pair in comparators(means, dime, column)] + \
                    [('controls', pair) for pair in controls(means, dime, column)]
                for family, (label, other) in compared:
                    pair = scores[[system, other]].dropna()
                    a, b = pair[system].to_numpy(), pair[other].to_numpy()
                    chosen = choose_test(a - b, test)
                    rows.append({'measure': measure, 'family': family, 'dime': dime, 'system': system,
                                 'comparison': label, 'other': other, 'n': len(pair), 'test': chosen,
                                 'alternative': alternative,
                                 'p_value': paired_p_value(a, b, chosen, alternative), 'margin_abs': margin_abs,
                                 **equivalence(a, b, margin_abs), '_diff': a - b})
    result = pd.DataFrame(rows, columns=COLUMNS + ['_diff'])
    for _, group in result.groupby(['measure', 'family'], sort=False):
        result.loc[group.index, 'p_holm'] = _holm(group['p_value'])
        result.loc[group.index, 'tost_p_holm'] = _holm(group['tost_p'])
    result['significant'] = result['p_holm'] < ALPHA
    result['verdict'] = [verdict(*args) for args in zip(result['_diff'], result['tost_p_holm'], result['p_holm'],
                                                         result['margin_abs'])]
    return result[COLUMNS].astype({'p_holm': float, 'tost_p_holm': float, 'significant': bool})
