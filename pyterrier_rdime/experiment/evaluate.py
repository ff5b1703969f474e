"""Evaluation of the grid: the measures and one per-query ``pt.Experiment`` (the paired comparisons are in
:mod:`.parity`)."""
from typing import Dict, Optional, Sequence, Tuple

import ir_measures
import pandas as pd
import pyterrier as pt

DEFAULT_MEASURES = ('nDCG@10', 'AP')
#: Added by default in retrieve mode, where the ranking is deep enough (as the author's dime-library reports them).
DEEP_MEASURES = ('R@1000', 'RR@10')
#: Binary measures whose relevance level ``--rel`` sets.
BINARY = ('AP', 'R', 'RR', 'P', 'Success')


def parse_measures(names: Sequence[str], rel: Optional[int] = None) -> list:
    """ir_measures objects of ``names``, with ``rel`` set on the binary measures; a bad name, cutoff or relevance
    level is a ValueError naming it (ir_measures accepts ``nDCG@0``, then trec_eval fails after the run)."""
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
        for param in ('cutoff', 'rel'):
            value = measure.params.get(param)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f'--measures: {measure} has {param} {value!r}; it must be an integer >= 1, e.g. '
                                 'nDCG@10, AP(rel=2)')
        measures.append(measure)
    return measures


def check_rel(rel: Optional[int], qrels: pd.DataFrame) -> None:
    """Fails when no judgment reaches the relevance level ``rel`` (every binary measure would be 0)."""
    if rel is not None and not (qrels['label'] >= rel).any():
        raise ValueError(f'--rel {rel}: no judgment has a label >= {rel} (the highest is {qrels["label"].max()}), '
                         'so every binary measure would be 0; use a level the qrels reach')


def evaluate(frames: Dict[str, pd.DataFrame], topics: pd.DataFrame, qrels: pd.DataFrame,
             measures: list) -> Tuple[pd.DataFrame, pd.DataFrame]:
    """``(aggregate, perquery)`` of one per-query ``pt.Experiment`` over the systems' result frames:
    ``system, measure, value`` (the mean over the queries) and ``system, qid, measure, value``."""
    perquery = pt.Experiment(list(frames.values()), topics, qrels, measures, names=list(frames), perquery=True,
                             verbose=False).rename(columns={'name': 'system'})
    aggregate = perquery.groupby(['system', 'measure'], sort=False)['value'].mean().reset_index()
    return aggregate, perquery
