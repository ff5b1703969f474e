"""The base of the DIME scorers: validation, grouping by query, the float32 check and the magnitude fallback."""
import warnings
from typing import Dict, Tuple

import numpy as np
import pandas as pd
import pyterrier as pt

from .. import maths
from .._config import ConfigTransformer
from .._frames import QueryGroups, empty_frame, group_queries, per_row, query_vectors


class DimeScorer(ConfigTransformer):
    """Base of the DIME scorers: adds ``query_dime``, the importance vector of each query (float32, like
    ``query_vec``; float64 when a value would fall below float32's normal range, ~1e-38, as with vectors scaled to
    ~1e-30: float32 would flush the importance to 0, and every query would lose its signal).

    With ``keep_ranking=True`` (default; the re-ranking setting) every input row is kept, so that a following
    threshold and scorer re-score the same candidates. With ``keep_ranking=False`` (the full-retrieval setting, like
    pyterrier-dr's ``VectorPrf``) the output is one row per query holding its query columns, ready for a retriever.
    """
    keep_ranking: bool

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        self._validate(inp)
        if self.keep_ranking:
            columns = list(inp.columns)
        else:  # PyTerrier's query columns, in the input's order (pt.model.query_columns returns them in set order)
            query_level = set(pt.model.query_columns(inp))
            columns = [c for c in inp.columns if c in query_level]
        added = ('query_dime',) + self._extra_columns()
        columns = [c for c in columns if c not in added] + list(added)
        if not len(inp):
            return empty_frame(inp, columns)
        inp = inp.reset_index(drop=True)
        groups = group_queries(inp, self)
        query_vecs = query_vectors(inp, 'query_vec', groups, self)
        importance, extra = self._importance_and_columns(inp, groups, query_vecs)
        self._check_float32(importance, query_vecs, inp, groups)
        importance = importance.astype(_output_dtype(importance))
        if self.keep_ranking:
            return inp.assign(query_dime=per_row(importance, groups.codes),
                              **{c: np.asarray(v)[groups.codes] for c, v in extra.items()})[columns]
        out = inp.iloc[groups.first_rows].reset_index(drop=True)
        return out.assign(query_dime=list(importance), **extra)[columns]

    def _validate(self, inp: pd.DataFrame) -> None:
        pt.validate.result_frame(inp, extra_columns=['query_vec', 'doc_vec', 'score'], context=self)

    def _importance(self, inp: pd.DataFrame, groups: QueryGroups, query_vecs: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _extra_columns(self) -> Tuple[str, ...]:
        """Per-query columns a stage adds beside ``query_dime`` (e.g. which queries an option changed)."""
        return ()

    def _importance_and_columns(self, inp: pd.DataFrame, groups: QueryGroups,
                                query_vecs: np.ndarray) -> Tuple[np.ndarray, Dict[str, np.ndarray]]:
        """The importance (n, p) and the values (n,) of :meth:`_extra_columns`."""
        return self._importance(inp, groups, query_vecs), {}

    def _check_float32(self, importance: np.ndarray, query_vecs: np.ndarray, inp: pd.DataFrame,
                       groups: QueryGroups) -> None:
        """``u`` multiplies two vector values: vectors beyond ~1e19 (finite in float32) overflow the float32
        ``query_dime``, and a later stage would only see inf. Say so here, where it happens."""
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
            qids = inp['qid'].to_numpy()[groups.first_rows[missing]]
            shown = ', '.join(map(repr, qids[:5])) + (' ...' if len(qids) > 5 else '')
            warnings.warn(f'{self}: {reason} for {len(qids)} quer{"y" if len(qids) == 1 else "ies"} ({shown}); '
                          'using magnitude importance u = q * q for them', stacklevel=3)
            importance = np.where(missing[:, None], maths.magnitude_dime(query_vecs), importance)
        return importance


def _output_dtype(importance: np.ndarray) -> type:
    """float32, unless float32 would flush a non-zero importance value towards 0 (below its smallest normal
    number, where it loses precision and then becomes 0)."""
    magnitude = np.abs(importance)
    tiny = (magnitude > 0) & (magnitude < np.finfo(np.float32).tiny)
    return np.float64 if tiny.any() else np.float32
