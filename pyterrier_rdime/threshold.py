"""Threshold rewriters: keep the important dimensions of ``query_vec`` and zero the others."""
from typing import Dict, Optional, Tuple

import numpy as np
import pandas as pd
import pyterrier as pt

from . import maths
from ._config import ConfigTransformer, check_choice, check_fraction, check_topk
from ._frames import check_same_dims, empty_frame, group_queries, per_row, query_vectors

FALLBACKS = ('full', 'top1')


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
        self.fallback = fallback
        self.modulator = modulator

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
        self.fraction = None if fraction is None else float(fraction)
        self.count = None if count is None else int(count)

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
        self.mass = float(mass)
        self.fallback = fallback

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
