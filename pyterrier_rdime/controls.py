"""Same-budget controls: keep as many dimensions as the threshold before them, chosen by another rule, to test
whether the DIME's *choice* of dimensions matters."""
from typing import Optional

import numpy as np
import pandas as pd
import pyterrier as pt

from . import maths
from ._config import ConfigTransformer, check_choice, check_int
from ._frames import QueryGroups, check_same_dims, empty_frame, group_queries, numeric_column, per_row, query_vectors
from .store import STREAM_BLOCK, vector_stats

CONTROLS = ('random', 'magnitude', 'variance', 'prefix')


class SameBudget(ConfigTransformer):
    """A same-budget control: per query, keep exactly as many dimensions as the threshold before it kept
    (``query_kept``), chosen by a rule that ignores the DIME importance; the query vector is the original ``q``
    (``query_vec_full``) on those dimensions and 0 elsewhere. It says how much the DIME's choice adds over that rule.

    Controls: ``'random'`` (fixed by ``seed`` and the qid), ``'magnitude'`` (largest ``q_j^2``), ``'variance'``
    (largest variance over ``index``'s documents), ``'prefix'`` (Matryoshka truncation). Ties keep the lower index.
    Details: pt_docs/thresholds.rst, "Same-budget controls".

    Args:
        control: ``'random'``, ``'magnitude'``, ``'variance'`` or ``'prefix'``.
        seed: the seed of ``'random'`` (an integer >= 0; other controls ignore it).
        index: for ``'variance'`` only, a pyterrier-dr ``FlexIndex`` or a ``(docs, p)`` array of document vectors.

    Input columns: ``qid, query_vec, query_vec_full, query_kept`` (after a threshold). Output columns: the input's,
    with ``query_vec`` replaced (float32) and ``query_mean_weight`` set to 1.0 where present.

    Example::

        dense = bm25 % 100 >> model.query_encoder() >> index.vec_loader() >> VectorScorer()
        chance = dense >> PrfDime() >> Rdime() >> SameBudget(control='random', seed=0) >> VectorScorer()

    Paper: the controls answer Takeshita et al. (arXiv 2508.17744) and Siciliano et al. (arXiv 2412.09983).
    """
    schematic = {'label': 'same budget'}

    def __init__(self, *, control: str, seed: int = 0, index: Optional[object] = None):
        stage = type(self).__name__
        check_choice(stage, 'control', control, CONTROLS)
        check_int(stage, 'seed', seed, 0, 'the seed of the random control')
        if control == 'variance':
            if not (isinstance(index, np.ndarray) or hasattr(index, 'index_path')):
                raise ValueError(f"{stage}: control='variance' needs index=, a pyterrier-dr FlexIndex or a (docs, p) "
                                 f'array of the document vectors; got {index!r}')
            if isinstance(index, np.ndarray) and (index.ndim != 2 or not len(index) or index.dtype.kind not in 'biuf'):
                raise ValueError(f"{stage}: index must be a non-empty (docs, p) array of real numbers, got an array of "
                                 f'shape {index.shape} and dtype {index.dtype}')
        elif index is not None:
            raise ValueError(f"{stage}: index= is used only by control='variance', not {control!r}; leave it out")
        self.control = control
        self.seed = seed
        self.index = index
        self._array_variance: Optional[np.ndarray] = None  # an array index's variances, computed on first use

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        try:
            pt.validate.columns(inp, includes=['qid', 'query_vec', 'query_vec_full', 'query_kept'], context=self)
        except pt.validate.InputValidationError as e:  # the same error (pt.inspect reads it), with the fix
            raise pt.validate.InputValidationError(
                f'{e.args[0]}; put SameBudget after a threshold (Rdime, TopK or ScoreMass): it writes the budget '
                'query_kept and keeps the unpruned query in query_vec_full', e.modes) from None
        if not len(inp):
            return empty_frame(inp, list(inp.columns))
        inp = inp.reset_index(drop=True)
        groups = group_queries(inp, self)
        full = query_vectors(inp, 'query_vec_full', groups, self)
        counts = self._budgets(inp, groups, full.shape[1])
        if self.control == 'random':
            qids = inp['qid'].to_numpy()[groups.first_rows]
            keep = maths.random_ranks([(self.seed, str(qid)) for qid in qids], full.shape[1]) < counts[:, None]
        else:
            keep = maths.keep_counts(self._order_key(full), counts)
        pruned = maths.modulate(full, keep).astype(np.float32)
        out = inp.assign(query_vec=per_row(pruned, groups.codes))
        if 'query_mean_weight' in out.columns:
            out = out.assign(query_mean_weight=1.0)
        return out

    def _budgets(self, inp: pd.DataFrame, groups: QueryGroups, dims: int) -> np.ndarray:
        """``query_kept`` per query, checked: a whole number in [0, p], the same on every row of a query."""
        fix = 'query_kept is the number of dimensions the threshold before SameBudget kept'
        kept = numeric_column(inp, 'query_kept', self, fix)
        firsts = kept[groups.first_rows]
        bad = ~((kept == firsts[groups.codes]) & (kept == np.round(kept)) & (kept >= 0) & (kept <= dims))
        if bad.any():
            row = int(np.argmax(bad))
            raise ValueError(f'{self}: query_kept is {inp["query_kept"].iloc[row]!r} at qid={inp["qid"].iloc[row]!r}; '
                             f'it must be a whole number of dimensions in [0, {dims}], the same on every row of a '
                             f'query ({fix})')
        return firsts.astype(np.int64)

    def _order_key(self, full: np.ndarray) -> np.ndarray:
        """What the control keeps the largest of: per query (n, p), or one global order (p,)."""
        if self.control == 'magnitude':
            return full * full
        if self.control == 'prefix':
            return -np.arange(full.shape[1], dtype=np.float64)
        if not isinstance(self.index, np.ndarray):  # checked against its fingerprint on every call: a rebuild is seen
            variance = document_variance(self.index, stage=str(self))
        elif (variance := self._array_variance) is None:  # two threads may both compute it: the same values, no harm
            variance = self._array_variance = document_variance(self.index, stage=str(self))
        check_same_dims(self, full.shape[1], len(variance), 'the index (document vectors)')
        return variance


def document_variance(index: object, *, stage: str = 'SameBudget') -> np.ndarray:
    """The variance of each dimension over the document vectors of ``index`` (float64, (p,)); for a FlexIndex from
    its cached statistics (:func:`pyterrier_rdime.store.vector_stats`)."""
    if not isinstance(index, np.ndarray):
        return vector_stats(index, stage=stage)['variance']
    variance, rows = maths.column_variance(index[start:start + STREAM_BLOCK]
                                           for start in range(0, len(index), STREAM_BLOCK))
    if not rows:
        raise ValueError(f'{stage}: the array index holds no documents; the variance control needs document vectors')
    if not np.isfinite(variance).all():
        raise ValueError(f'{stage}: a document vector of the array index has NaN or infinite values, so the variance '
                         'of its dimensions is undefined; re-encode or drop that document')
    return variance
