"""The base of the DIME scorers (validation, grouping by query, the float32 check, the magnitude fallback) and
Magnitude DIME."""
import warnings
from typing import Dict, Tuple

import numpy as np
import pandas as pd
import pyterrier as pt

from .. import maths
from .._config import ConfigTransformer, check_bool
from .._frames import QueryGroups, empty_frame, group_queries, per_row, query_vectors


class DimeScorer(ConfigTransformer):
    """Base of the DIME scorers: adds ``query_dime``, each query's importance vector (float32, or float64 where
    float32 would flush it to 0). ``keep_ranking=True`` keeps every row (re-ranking); ``False`` returns one row per
    query with its query columns, for a retriever (as pyterrier-dr's ``VectorPrf``)."""
    keep_ranking: bool

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        self._validate(inp)
        if self.keep_ranking:
            columns = list(inp.columns)
        else:  # the query columns in the input's order (pt.model.query_columns gives a set's)
            query_level = set(pt.model.query_columns(inp))
            columns = [c for c in inp.columns if c in query_level]
        added = ('query_dime',) + self._extra_columns()
        columns = [c for c in columns if c not in added] + list(added)
        if not len(inp):
            return empty_frame(inp, columns)
        inp = inp.reset_index(drop=True)
        groups = group_queries(inp, self)
        query_vecs = query_vectors(inp, 'query_vec', groups, self)
        importance, extra = self._importance(inp, groups, query_vecs)
        self._check_float32(importance, query_vecs, inp, groups)
        importance = importance.astype(_output_dtype(importance))
        if self.keep_ranking:
            return inp.assign(query_dime=per_row(importance, groups.codes),
                              **{c: np.asarray(v)[groups.codes] for c, v in extra.items()})[columns]
        out = inp.iloc[groups.first_rows].reset_index(drop=True)
        return out.assign(query_dime=list(importance), **extra)[columns]

    def _validate(self, inp: pd.DataFrame) -> None:
        pt.validate.result_frame(inp, extra_columns=['query_vec', 'doc_vec', 'score'], context=self)

    def _importance(self, inp: pd.DataFrame, groups: QueryGroups,
                    query_vecs: np.ndarray) -> Tuple[np.ndarray, Dict[str, np.ndarray]]:
        """The importance (n, p) and the values (n,) of :meth:`_extra_columns`."""
        raise NotImplementedError

    def _extra_columns(self) -> Tuple[str, ...]:
        """Per-query columns a stage adds beside ``query_dime`` (e.g. which queries an option changed)."""
        return ()

    def _check_float32(self, importance: np.ndarray, query_vecs: np.ndarray, inp: pd.DataFrame,
                       groups: QueryGroups) -> None:
        """Vectors beyond ~1e19 overflow the float32 ``query_dime``: say so here, not as an inf later."""
        bad = ~(np.abs(importance) <= np.finfo(np.float32).max)  # NaN too
        if bad.any():
            row = int(np.argmax(bad.any(axis=1)))
            peak = np.abs(importance[row])
            peak = f'{peak[~np.isnan(peak)].max():.3g}' if not np.isnan(peak).all() else 'NaN'
            raise ValueError(f'{self}: query_dime of qid={inp["qid"].iloc[groups.first_rows[row]]!r} reaches '
                             f'{peak}, beyond float32 (max {np.finfo(np.float32).max:.3g}); its query_vec has '
                             f'values up to {np.abs(query_vecs[row]).max():.3g}. Normalise the query and document '
                             'vectors (e.g. to unit length) before this stage')

    def _magnitude_fallback(self, importance: np.ndarray, query_vecs: np.ndarray, missing: np.ndarray,
                            inp: pd.DataFrame, groups: QueryGroups, reason: str) -> np.ndarray:
        """Use u = q * q (as the reference code does) for the queries flagged in ``missing``, and say so."""
        if missing.any():
            warnings.warn(f'{self}: {reason} for {some_queries(inp, groups, missing)}; using magnitude importance '
                          'u = q * q for them', stacklevel=3)
            importance = np.where(missing[:, None], maths.magnitude_dime(query_vecs), importance)
        return importance


class MagnitudeDime(DimeScorer):
    """Magnitude DIME ``u = q * q``: needs no feedback.

    Input columns: ``qid, query_vec`` (a query or a result frame). Output columns: the input's plus ``query_dime``.
    """
    schematic = {'label': 'Magnitude'}

    def __init__(self, *, keep_ranking: bool = True):
        check_bool(type(self).__name__, 'keep_ranking', keep_ranking)
        self.keep_ranking = keep_ranking

    def _validate(self, inp):
        pt.validate.columns(inp, includes=['qid', 'query_vec'], context=self)

    def _importance(self, inp, groups, query_vecs):
        return maths.magnitude_dime(query_vecs), {}


def some_queries(inp: pd.DataFrame, groups: QueryGroups, which: np.ndarray) -> str:
    """``2 queries ('q1', 'q2')``: the queries flagged in ``which`` (the first five shown), for a warning."""
    qids = inp['qid'].to_numpy()[groups.first_rows[which]]
    shown = ', '.join(map(repr, qids[:5])) + (' ...' if len(qids) > 5 else '')
    return f'{len(qids)} quer{"y" if len(qids) == 1 else "ies"} ({shown})'


def _output_dtype(importance: np.ndarray) -> type:
    """float32, unless it would flush a non-zero importance value below its smallest normal number."""
    magnitude = np.abs(importance)
    tiny = (magnitude > 0) & (magnitude < np.finfo(np.float32).tiny)
    return np.float64 if tiny.any() else np.float32
