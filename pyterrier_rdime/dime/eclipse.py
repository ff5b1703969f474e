"""Eclipse DIME: positive and negative feedback."""
from .. import maths
from .._config import check_bool, check_int, check_nonnegative
from .._frames import gather_vectors, select_feedback
from ._base import DimeScorer


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
        check_nonnegative(stage, 'alpha', alpha)
        check_nonnegative(stage, 'beta', beta)
        if alpha == 0 and beta == 0:
            raise ValueError(f'{stage}: alpha and beta are both 0, so every importance would be 0 (no signal); give '
                             'the positives (alpha) or the negatives (beta) a positive weight')
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
