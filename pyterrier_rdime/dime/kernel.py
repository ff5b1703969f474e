"""Kernel DIME and its named cases (PRF, SWC), Eclipse DIME, and the cutoff to their feedback documents."""
from typing import Optional, Union

import numpy as np
import pandas as pd
import pyterrier as pt

from .. import maths
from .._config import ConfigTransformer, check_bool, check_choice, check_int, check_positive, check_weights
from .._frames import gather_vectors, group_queries, select_feedback
from ._base import DimeScorer


class KernelDime(DimeScorer):
    """Kernel DIME: ``u = q * sum_i w_i d_i`` over the ``num_docs`` highest-``score`` rows of each query (ties keep
    input order), ``w_i`` a normalised kernel (:func:`~pyterrier_rdime.maths.kernel_weights`: ``'uniform'``,
    ``'softmax'``, ``'rbf'``, ``'sigmoid'``, ``'rank'`` or a callable).

    Input columns: ``qid, query_vec, docno, doc_vec, score``. Output columns: the input's plus ``query_dime``
    (one row per query with ``keep_ranking=False``).

    Example::

        pipe = bm25 % 100 >> model.query_encoder() >> index.vec_loader() >> KernelDime(kernel='rank', num_docs=5) \\
            >> Rdime() >> VectorScorer()

    Paper: Kernel DIME, D'Erasmo et al., *Statistical Foundations of DIME* (EACL 2026), Eq. 3.
    """
    schematic = {'label': 'KernelDIME'}

    def __init__(self, *, kernel: Union[str, maths.KernelFn] = 'uniform', num_docs: int = 2, tau: float = 0.1,
                 keep_ranking: bool = True):
        stage = type(self).__name__
        if not callable(kernel):
            check_choice(stage, 'kernel', kernel, maths.KERNELS,
                         'or pass a callable kernel(query_vecs, doc_vecs) -> (n, m) similarities')
        check_int(stage, 'num_docs', num_docs, 1)
        check_positive(stage, 'tau', tau)
        check_bool(stage, 'keep_ranking', keep_ranking)
        self.kernel = kernel
        self.num_docs = num_docs
        self.tau = tau
        self.keep_ranking = keep_ranking

    def compile(self) -> pt.Transformer:
        """With ``keep_ranking=False``, cut the first ranking to the feedback documents (:class:`FeedbackCutoff`)."""
        return self if self.keep_ranking else FeedbackCutoff(num_docs=self.num_docs) >> self

    def _importance(self, inp, groups, query_vecs):
        feedback = select_feedback(inp, groups, self.num_docs, self)
        doc_vecs = gather_vectors(inp, 'doc_vec', feedback, query_vecs.shape[1], self)
        try:
            weights = maths.kernel_weights(self.kernel, query_vecs, doc_vecs, feedback.mask, tau=self.tau)
        except ValueError as e:  # a callable kernel's output: name the stage
            raise ValueError(f'{self}: {e}') from None
        unweighted = feedback.mask.any(axis=1) & ~(weights.sum(axis=1) > 0)
        if unweighted.any():  # only a callable kernel can do that: u = 0 would be no signal
            qid = inp['qid'].iloc[groups.first_rows[int(np.argmax(unweighted))]]
            raise ValueError(f'{self}: the kernel gives every feedback document of qid={qid!r} similarity 0, so its '
                             'importance would be all zero; a kernel must give some feedback document a positive '
                             'similarity')
        return maths.kernel_dime(query_vecs, doc_vecs, weights), {}


class PrfDime(KernelDime):
    """PRF DIME: :class:`KernelDime` with uniform weights over the top-``num_docs`` documents (default 2, as in the
    RDIME code); unbiased for the squared latent signal (the paper's Theorem 2). Example::

        pipe = bm25 % 100 >> model.query_encoder() >> index.vec_loader() >> PrfDime() >> Rdime() >> VectorScorer()
    """
    schematic = {'label': 'PRF-DIME'}

    def __init__(self, *, num_docs: int = 2, keep_ranking: bool = True):
        super().__init__(kernel='uniform', num_docs=num_docs, keep_ranking=keep_ranking)


class SwcDime(KernelDime):
    """SWC DIME: :class:`KernelDime` with weights ``softmax(q.d_i / tau)`` over the top-``num_docs`` documents
    (defaults 10 and 0.1, as in the RDIME code), an approximation of the inverse-variance weights. Example::

        pipe = bm25 % 100 >> model.query_encoder() >> index.vec_loader() >> SwcDime() >> Rdime() >> VectorScorer()
    """
    schematic = {'label': 'SWC-DIME'}

    def __init__(self, *, num_docs: int = 10, tau: float = 0.1, keep_ranking: bool = True):
        super().__init__(kernel='softmax', num_docs=num_docs, tau=tau, keep_ranking=keep_ranking)


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
                                  alpha=self.alpha, beta=self.beta), {}


class FeedbackCutoff(ConfigTransformer):
    """Keeps the ``num_docs`` highest-``score`` rows of each query (ties keep input order), the feedback documents
    of a DIME stage: ``pt.RankCutoff`` by score rather than by a ``rank`` that may be stale; fused into a preceding
    retriever like it.

    Input columns: ``qid, docno, score``. Output columns: the input's, rows in input order.
    """
    schematic = {'label': 'feedback cut'}

    def __init__(self, *, num_docs: int):
        check_int(type(self).__name__, 'num_docs', num_docs, 1)
        self.num_docs = num_docs

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        pt.validate.result_frame(inp, extra_columns=['score'], context=self)
        if not len(inp):
            return inp
        inp = inp.reset_index(drop=True)
        feedback = select_feedback(inp, group_queries(inp, self), self.num_docs, self)
        return inp.iloc[np.sort(feedback.rows[feedback.mask])].reset_index(drop=True)

    def fuse_left(self, left: pt.Transformer) -> Optional[pt.Transformer]:
        if isinstance(left, pt.transformer.SupportsFuseRankCutoff):
            return left.fuse_rank_cutoff(self.num_docs)
        return None
