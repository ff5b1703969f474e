"""The stages on ``query_vec`` after a DIME: threshold rewriters keep its important dimensions and zero the others,
same-budget controls keep as many chosen by another rule (does the DIME's *choice* of dimensions matter?), and
:class:`VectorScorer` re-scores the candidates with it."""
from typing import Dict, Optional, Tuple

import numpy as np
import pandas as pd
import pyterrier as pt

from . import maths
from ._config import ConfigTransformer, check_choice, check_fraction, check_int, check_topk
from ._frames import (
    QueryGroups,
    check_same_dims,
    empty_frame,
    group_queries,
    numeric_column,
    per_row,
    query_vectors,
    stack_vectors,
)
from .store import STREAM_BLOCK, vector_stats

FALLBACKS = ('full', 'top1')
CONTROLS = ('random', 'magnitude', 'variance', 'prefix')


class DimensionThreshold(ConfigTransformer):
    """Base of the threshold rewriters: replaces ``query_vec`` by the pruned query, adds ``query_kept`` and
    ``query_kept_frac``, and keeps the unpruned query in ``query_vec_full`` (for :class:`~pyterrier_rdime.SameBudget`;
    a second threshold leaves it). Works on result and query frames alike."""
    output_columns: Tuple[str, ...] = ('query_kept', 'query_kept_frac')

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        pt.validate.columns(inp, includes=['qid', 'query_vec', 'query_dime'], context=self)
        added = ('query_vec_full',) + tuple(self.output_columns)
        columns = list(inp.columns) + [c for c in added if c not in inp.columns]
        if not len(inp):
            return empty_frame(inp, columns)
        inp = inp.reset_index(drop=True)
        groups = group_queries(inp, self)
        query_vecs = query_vectors(inp, 'query_vec', groups, self)
        importance = query_vectors(inp, 'query_dime', groups, self)
        check_same_dims(self, query_vecs.shape[1], importance.shape[1], 'query_dime')
        keep, extra = self._keep(query_vecs, importance)  # a 0/1 mask, or Rdime's soft weights
        pruned = maths.modulate(query_vecs, keep).astype(np.float32)
        kept = np.count_nonzero(keep, axis=1)
        per_query = {'query_kept': kept, 'query_kept_frac': kept / keep.shape[1], **extra}
        if 'query_vec_full' not in inp.columns:
            inp = inp.assign(query_vec_full=inp['query_vec'])
        return inp.assign(query_vec=per_row(pruned, groups.codes),
                          **{c: np.asarray(v)[groups.codes] for c, v in per_query.items()})[columns]

    def _keep(self, query_vecs: np.ndarray, importance: np.ndarray) -> Tuple[np.ndarray, Dict[str, np.ndarray]]:
        raise NotImplementedError


class Rdime(DimensionThreshold):
    """RDIME: keep dimension ``j`` when ``u_j > eps2 = mean_j(q_j^2 - u_j)``, estimated per query from its own
    ``query_dime``; no hyper-parameter. ``modulator='james-stein'`` or ``'wiener'`` weights the query instead
    (:func:`~pyterrier_rdime.maths.modulator_weights`). An empty kept set falls back to ``fallback``: ``'full'`` (the
    unpruned query) or ``'top1'`` (the most important dimension).

    Input columns: ``qid, query_vec, query_dime``. Output columns: the input's with ``query_vec`` modulated, plus
    ``query_vec_full``, ``query_kept``, ``query_kept_frac``, ``query_eps2``, ``query_fallback`` and
    ``query_mean_weight`` (over the kept dimensions).

    Example::

        pipe = bm25 % 100 >> model.query_encoder() >> index.vec_loader() >> PrfDime() >> Rdime() >> VectorScorer()

    Paper: D'Erasmo et al., *Statistical Foundations of DIME: Risk Estimation for Practical Index Selection*
    (EACL 2026), Corollary 1 (``'hard'``); the soft modulators follow from the same risk model.
    """
    schematic = {'label': 'RDIME'}
    output_columns = ('query_kept', 'query_kept_frac', 'query_eps2', 'query_fallback', 'query_mean_weight')

    def __init__(self, *, fallback: str = 'full', modulator: str = 'hard'):
        stage = type(self).__name__
        check_choice(stage, 'fallback', fallback, FALLBACKS)
        check_choice(stage, 'modulator', modulator, maths.MODULATOR_NAMES)
        super().__init__(fallback=fallback, modulator=modulator)

    def _keep(self, query_vecs, importance):
        weights, eps2 = maths.modulation_weights(query_vecs, importance, self.modulator)
        weights, empty = _fall_back(weights, importance, self.fallback)
        mean_weight = weights.sum(axis=1) / np.count_nonzero(weights, axis=1)
        return weights, {'query_eps2': eps2, 'query_fallback': empty, 'query_mean_weight': mean_weight}


class TopK(DimensionThreshold):
    """Top-k: keep the ``round(fraction * p)`` (``fraction`` in (0, 1], at least 1; default 0.6) or ``count`` (capped
    at ``p``) most important dimensions of each query; ties keep the lower index.

    Input columns: ``qid, query_vec, query_dime``. Output columns: the input's, with ``query_vec`` pruned, plus
    ``query_vec_full`` (the query before pruning), ``query_kept`` and ``query_kept_frac``.

    Example::

        pipe = bm25 % 100 >> model.query_encoder() >> index.vec_loader() >> PrfDime() >> TopK(count=300) \\
            >> VectorScorer()

    Paper: Top-k thresholding, Eq. 1 of D'Erasmo et al. (EACL 2026), with fractions 0.4, 0.6 and 0.8.
    """
    schematic = {'label': 'Top-k'}

    def __init__(self, *, fraction: Optional[float] = None, count: Optional[int] = None):
        if fraction is None and count is None:
            fraction = 0.6
        check_topk(type(self).__name__, fraction, count)
        super().__init__(fraction=None if fraction is None else float(fraction),
                         count=None if count is None else int(count))

    def _keep(self, query_vecs, importance):
        count = maths.topk_count(importance.shape[1], fraction=self.fraction, count=self.count)
        return maths.topk_threshold(importance, count), {}


class ScoreMass(DimensionThreshold):
    """Score mass: keep the most important dimensions of each query until their share of its positive importance
    mass ``sum_j max(u_j, 0)`` reaches ``mass`` in (0, 1] (ties: lower index), so a concentrated query keeps few. A
    query with no positive importance falls back as :class:`Rdime` does (``fallback``).

    Input columns: ``qid, query_vec, query_dime``. Output columns: the input's, with ``query_vec`` pruned, plus
    ``query_vec_full``, ``query_kept``, ``query_kept_frac`` and ``query_fallback``.

    Example::

        pipe = bm25 % 100 >> model.query_encoder() >> index.vec_loader() >> PrfDime() >> ScoreMass(mass=0.8) \\
            >> VectorScorer()

    Paper: Unveiling DIME (SIGIR 2025), the score-mass mode of its dimension zero-out.
    """
    schematic = {'label': 'Score mass'}
    output_columns = ('query_kept', 'query_kept_frac', 'query_fallback')

    def __init__(self, *, mass: float = 0.8, fallback: str = 'full'):
        stage = type(self).__name__
        check_fraction(stage, 'mass', mass, 'a share of the positive importance mass')
        check_choice(stage, 'fallback', fallback, FALLBACKS)
        super().__init__(mass=float(mass), fallback=fallback)

    def _keep(self, query_vecs, importance):
        keep = maths.score_mass_threshold(importance, self.mass).astype(np.float64)
        keep, empty = _fall_back(keep, importance, self.fallback)
        return keep, {'query_fallback': empty}


def _fall_back(weights: np.ndarray, importance: np.ndarray, fallback: str) -> Tuple[np.ndarray, np.ndarray]:
    """``(weights, fell_back)``: a query that keeps nothing (an all-zero query ranks arbitrarily) gets the full
    query or, for ``'top1'``, its most important dimension."""
    empty = ~weights.any(axis=1)
    if empty.any():
        replacement = np.ones_like(weights) if fallback == 'full' else maths.topk_threshold(importance, 1)
        weights = np.where(empty[:, None], replacement, weights)
    return weights, empty


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
        super().__init__(control=control, seed=seed, index=index)
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
        keep = maths.keep_counts(self._order_key(full, inp['qid'].to_numpy()[groups.first_rows]), counts)
        pruned = maths.modulate(full, keep).astype(np.float32)
        mean_weight = {'query_mean_weight': 1.0} if 'query_mean_weight' in inp.columns else {}
        return inp.assign(query_vec=per_row(pruned, groups.codes), **mean_weight)

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

    def _order_key(self, full: np.ndarray, qids: np.ndarray) -> np.ndarray:
        """What the control keeps the largest of: per query (n, p), or one global order (p,)."""
        if self.control == 'random':  # a uniform random order of the dimensions, fixed by the seed and the qid
            return -maths.random_ranks([(self.seed, str(qid)) for qid in qids], full.shape[1])
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


class VectorScorer(ConfigTransformer):
    """Re-scores each candidate by the inner product of ``query_vec`` and its ``doc_vec`` and re-ranks per query:
    ``FlexIndex.scorer()``'s float32 scores from the vectors already in the frame (an inner product below float32's
    normal range is computed in float64, so that tiny vectors still rank).

    Input columns: ``qid, query_vec, docno, doc_vec``. Output columns: the input's with new ``score`` and ``rank``,
    sorted by query and descending score.

    Example::

        pipe = bm25 % 100 >> model.query_encoder() >> index.vec_loader() >> PrfDime() >> Rdime() >> VectorScorer()
    """
    schematic = {'label': 'VectorScorer'}

    def __init__(self):
        pass

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        pt.validate.result_frame(inp, extra_columns=['query_vec', 'doc_vec'], context=self)
        columns = list(inp.columns) + [c for c in ('score', 'rank') if c not in inp.columns]
        if not len(inp):
            return empty_frame(inp, columns)
        inp = inp.reset_index(drop=True)
        groups = group_queries(inp, self)
        query_vecs64 = query_vectors(inp, 'query_vec', groups, self)
        doc_vecs64 = stack_vectors(inp, 'doc_vec', np.arange(len(inp)), self, 'docno')
        query_vecs, doc_vecs = query_vecs64.astype(np.float32), doc_vecs64.astype(np.float32)
        check_same_dims(self, query_vecs.shape[1], doc_vecs.shape[1], 'doc_vec')
        with np.errstate(over='ignore', invalid='ignore'):  # reported below, with the row to blame
            scores = np.einsum('rp,rp->r', query_vecs[groups.codes], doc_vecs).astype(np.float64)
        small = np.abs(scores) < np.finfo(np.float32).tiny  # 0 or subnormal: float32 may have flushed it
        if small.any():
            rows = np.flatnonzero(small)
            scores[rows] = np.einsum('rp,rp->r', query_vecs64[groups.codes[rows]], doc_vecs64[rows])
        finite = np.isfinite(scores)
        if not finite.all():
            bad = int(np.argmin(finite))
            q_peak, d_peak = np.abs(query_vecs[groups.codes[bad]]).max(), np.abs(doc_vecs[bad]).max()
            raise ValueError(f'{self}: the inner product of qid={inp["qid"].iloc[bad]!r} and '
                             f'docno={inp["docno"].iloc[bad]!r} overflows float32 (vector values up to {q_peak:.3g} '
                             f'and {d_peak:.3g}); normalise the query and document vectors (e.g. to unit length)')
        out = inp.assign(score=scores).sort_values(['qid', 'score'], ascending=[True, False], kind='stable')
        return pt.model.add_ranks(out)[columns]
