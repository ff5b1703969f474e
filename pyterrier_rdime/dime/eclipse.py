"""Eclipse DIME: positive and negative feedback, the positives from the ranking or from an LLM answer."""
import warnings
from typing import Optional

import numpy as np

from .. import maths
from .._config import check_bool, check_int, check_weights
from .._frames import gather_vectors, select_feedback
from ._base import DimeScorer, some_queries
from .llm import answer_vectors, check_encoder, validate_answers


class EclipseDime(DimeScorer):
    """Eclipse DIME: ``u = alpha * q * mean(top-num_pos docs) - beta * q * mean(bottom-num_neg docs)`` of the
    incoming ranking (defaults 2, 5, 1.0, 0.5 as in the Eclipse code). Negatives never include a positive.
    It needs the whole first ranking, so ``compile()`` does not cut it.

    Input columns: ``qid, query_vec, docno, doc_vec, score``. Output columns: the input's plus ``query_dime``.
    """
    schematic = {'label': 'Eclipse'}

    def __init__(self, *, num_pos: int = 2, num_neg: int = 5, alpha: float = 1.0, beta: float = 0.5,
                 keep_ranking: bool = True):
        stage = type(self).__name__
        check_int(stage, 'num_pos', num_pos, 1)
        check_int(stage, 'num_neg', num_neg, 1)
        check_weights(stage, alpha, beta, 'the positives', 'the negatives')
        check_bool(stage, 'keep_ranking', keep_ranking)
        self.num_pos = num_pos
        self.num_neg = num_neg
        self.alpha = alpha
        self.beta = beta
        self.keep_ranking = keep_ranking

    def _importance(self, inp, groups, query_vecs):
        dims = query_vecs.shape[1]
        pos = select_feedback(inp, groups, self.num_pos, self)
        neg = select_feedback(inp, groups, self.num_neg, self, from_bottom=True, skip_top=self.num_pos)
        return maths.eclipse_dime(query_vecs, gather_vectors(inp, 'doc_vec', pos, dims, self), pos.mask,
                                  gather_vectors(inp, 'doc_vec', neg, dims, self), neg.mask,
                                  alpha=self.alpha, beta=self.beta)


class LlmEclipseDime(DimeScorer):
    """Eclipse with an LLM answer as the positive: ``u = alpha * q * a - beta * q * mean(bottom-num_neg docs)``, ``a``
    the answer's embedding (read as :class:`~pyterrier_rdime.LlmDime` reads it); a query without one uses ``q`` in its
    place, with a warning. It needs the bottom of the first ranking, so ``compile()`` does not cut it.

    Input columns: ``qid, query_vec, docno, doc_vec, score`` and ``query_answer_vec`` or ``query_answer`` (text,
    encoded with ``encoder.encode_docs``). Output columns: the input's plus ``query_dime``.

    Example::

        pipe = bm25 % 100 >> model.query_encoder() >> index.vec_loader() >> LlmAnswers.from_tsv('answers.tsv') \\
            >> LlmEclipseDime(encoder=model) >> Rdime() >> VectorScorer()

    Paper: D'Erasmo et al., *Eclipse: Contrastive Dimension Importance Estimation with Pseudo-Irrelevance Feedback*
    (ICTIR 2025), Eclipse-LLM (dime-library ``filters/eclipse.py``; the Missing-Role repository's ``LLMEclipse``).
    """
    schematic = {'label': 'LLM-Eclipse'}

    def __init__(self, *, encoder: Optional[object] = None, num_neg: int = 5, alpha: float = 1.0, beta: float = 0.5,
                 keep_ranking: bool = True):
        stage = type(self).__name__
        check_encoder(stage, encoder)
        check_int(stage, 'num_neg', num_neg, 1)
        check_weights(stage, alpha, beta, 'the answer', 'the negatives')
        check_bool(stage, 'keep_ranking', keep_ranking)
        self.encoder = encoder
        self.num_neg = num_neg
        self.alpha = alpha
        self.beta = beta
        self.keep_ranking = keep_ranking

    def _validate(self, inp):
        validate_answers(inp, self, ['docno', 'doc_vec', 'score'])

    def _importance(self, inp, groups, query_vecs):
        answers, present = answer_vectors(self, self.encoder, inp, groups, query_vecs)
        if not present.all():
            warnings.warn(f'{self}: no LLM answer for {some_queries(inp, groups, ~present)}; using the query itself '
                          'as their positive (u = alpha * q * q - beta * q * mean(negatives))', stacklevel=3)
            answers = np.where(present[:, None], answers, query_vecs)
        neg = select_feedback(inp, groups, self.num_neg, self, from_bottom=True)
        one = np.ones((groups.size, 1), dtype=bool)
        return maths.eclipse_dime(query_vecs, answers[:, None, :], one,
                                  gather_vectors(inp, 'doc_vec', neg, query_vecs.shape[1], self), neg.mask,
                                  alpha=self.alpha, beta=self.beta)
