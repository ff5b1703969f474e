"""Active-feedback DIME: the importance from one judged relevant document (and one judged non-relevant)."""
import warnings

import numpy as np
import pandas as pd

from .. import maths
from .._config import check_bool, check_weights
from .._frames import Feedback, gather_vectors, select_feedback
from ._base import DimeScorer, some_queries
from .oracle import candidate_labels, check_qrels


class ActiveFeedbackDime(DimeScorer):
    """Active-feedback DIME, an upper bound that reads the judgments (``qrels``: ``qid, docno, label``), as if a user
    had marked one relevant document ``d_rel`` (the highest label > 0; among equals the highest-scored) and, with
    ``beta > 0``, one non-relevant ``d_non`` (the lowest label <= 0): ``u = alpha * q * d_rel - beta * q * d_non``.
    Without ``d_rel`` a query falls back to ``u = q * q``, without ``d_non`` it gets no negative term (warnings).

    Input columns: ``qid, query_vec, docno, doc_vec, score``. Output columns: the input's plus ``query_dime``.

    Example::

        pipe = bm25 % 100 >> model.query_encoder() >> index.vec_loader() \\
            >> ActiveFeedbackDime(qrels=dataset.get_qrels(), beta=0.5) >> Rdime() >> VectorScorer()

    Paper: Faggioli et al., *Dimension Importance Estimation for Dense Information Retrieval* (SIGIR 2024), the
    active-feedback setting; D'Erasmo et al., *The Missing Role of Negative Feedback in DIME*.
    """
    schematic = {'label': 'Active FB'}

    def __init__(self, *, qrels: pd.DataFrame, alpha: float = 1.0, beta: float = 0.0, keep_ranking: bool = True):
        stage = type(self).__name__
        check_qrels(qrels, stage)
        check_weights(stage, alpha, beta, 'the relevant document', 'the non-relevant one')
        check_bool(stage, 'keep_ranking', keep_ranking)
        self.qrels = qrels
        self.alpha = alpha
        self.beta = beta
        self.keep_ranking = keep_ranking

    def _importance(self, inp, groups, query_vecs):
        labels = candidate_labels(inp, self.qrels, self)
        ranked = select_feedback(inp, groups, len(inp), self)  # every candidate by score
        slot_labels = np.where(ranked.mask, labels[np.where(ranked.mask, ranked.rows, 0)], np.nan)
        with np.errstate(invalid='ignore'):  # NaN (unjudged, padding) compares False: never chosen
            relevant = np.where(slot_labels > 0, slot_labels, -np.inf)
            non_relevant = np.where(slot_labels <= 0, slot_labels, np.inf)
        pos = _one(ranked, np.argmax(relevant, axis=1), np.isfinite(relevant).any(axis=1))
        neg = _one(ranked, np.argmin(non_relevant, axis=1), np.isfinite(non_relevant).any(axis=1))
        dims = query_vecs.shape[1]
        if self.beta > 0 and not neg.mask.all():
            missing = ~neg.mask[:, 0] & pos.mask[:, 0]  # the queries without a positive are reported below
            if missing.any():
                warnings.warn(f'{self}: no judged non-relevant candidate for {some_queries(inp, groups, missing)}; '
                              'no negative term for them', stacklevel=4)
        importance = maths.eclipse_dime(query_vecs, gather_vectors(inp, 'doc_vec', pos, dims, self), pos.mask,
                                        gather_vectors(inp, 'doc_vec', neg, dims, self), neg.mask,
                                        alpha=self.alpha, beta=self.beta)
        return self._magnitude_fallback(importance, query_vecs, ~pos.mask[:, 0], inp, groups,
                                        'no judged relevant candidate')


def _one(ranked: Feedback, slot: np.ndarray, found: np.ndarray) -> Feedback:
    """One feedback document per query: the row at ``slot`` of the ranked candidates, where ``found``."""
    rows = np.where(found, ranked.rows[np.arange(len(slot)), slot], -1)[:, None]
    return Feedback(rows, rows >= 0)
