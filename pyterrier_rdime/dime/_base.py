"""DIME scorers: PyTerrier stages that add the per-query dimension importance ``query_dime``."""
import warnings
from typing import Optional, Union

import numpy as np
import pandas as pd
import pyterrier as pt

from . import maths
from ._config import ConfigTransformer, check_bool, check_choice, check_int, check_nonnegative, check_positive
from ._frames import (
    QueryGroups,
    check_same_dims,
    empty_frame,
    gather_vectors,
    group_queries,
    per_row,
    query_columns,
    select_feedback,
    stack_vectors,
)


class DimeScorer(ConfigTransformer):
    """Base of the DIME scorers: adds ``query_dime``, the importance vector of each query (float32, like
    ``query_vec``).

    With ``keep_ranking=True`` (default; the re-ranking setting) every input row is kept, so that a following
    threshold and scorer re-score the same candidates. With ``keep_ranking=False`` (the full-retrieval setting, like
    pyterrier-dr's ``VectorPrf``) the output is one row per query holding its query columns, ready for a retriever.
    """
    keep_ranking: bool

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        self._validate(inp)
        if self.keep_ranking:
            columns = list(inp.columns)
        else:
            columns = query_columns(inp.columns)
        columns = [c for c in columns if c != 'query_dime'] + ['query_dime']
        if not len(inp):
            return empty_frame(inp, columns)
        inp = inp.reset_index(drop=True)
        groups = group_queries(inp, self)
        query_vecs = stack_vectors(inp, 'query_vec', groups.first_rows, self, 'qid')
        importance = self._importance(inp, groups, query_vecs)
        self._check_float32(importance, query_vecs, inp, groups)
        importance = importance.astype(np.float32)
        if self.keep_ranking:
            return inp.assign(query_dime=per_row(importance, groups.codes))[columns]
        out = inp.iloc[groups.first_rows].reset_index(drop=True)
        return out.assign(query_dime=list(importance))[columns]

    def _validate(self, inp: pd.DataFrame) -> None:
        pt.validate.result_frame(inp, extra_columns=['query_vec', 'doc_vec', 'score'], context=self)

    def _importance(self, inp: pd.DataFrame, groups: QueryGroups, query_vecs: np.ndarray) -> np.ndarray:
        raise NotImplementedError

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


class KernelDime(DimeScorer):
    """Kernel DIME: ``u = q * sum_i w_i d_i`` over the top-``num_docs`` documents of the incoming ranking, with
    ``w_i`` a normalised kernel of the query and the document (see :func:`pyterrier_rdime.maths.kernel_weights`:
    ``'uniform'``, ``'softmax'``, ``'rbf'``, ``'sigmoid'``, ``'rank'`` or a callable).

    Feedback documents are the ``num_docs`` highest-``score`` rows of each query (ties keep input order); a query
    with fewer rows uses the ones it has.

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
        """In the full-retrieval setting only the feedback documents are needed: cut the first ranking to them, by
        score as this stage selects them (:class:`FeedbackCutoff`, fused into a preceding retriever)."""
        return self if self.keep_ranking else FeedbackCutoff(num_docs=self.num_docs) >> self

    def _importance(self, inp, groups, query_vecs):
        feedback = select_feedback(inp, groups, self.num_docs, self)
        doc_vecs = gather_vectors(inp, 'doc_vec', feedback, query_vecs.shape[1], self)
        weights = maths.kernel_weights(self.kernel, query_vecs, doc_vecs, feedback.mask, tau=self.tau)
        return maths.kernel_dime(query_vecs, doc_vecs, weights)


class PrfDime(KernelDime):
    """PRF DIME: Kernel DIME with uniform weights over the top-``num_docs`` feedback documents (default 2, as in the
    RDIME code). Unbiased for the squared latent signal (the paper's Theorem 2).

    Input columns: ``qid, query_vec, docno, doc_vec, score``. Output columns: the input's plus ``query_dime``.

    Example::

        pipe = bm25 % 100 >> model.query_encoder() >> index.vec_loader() >> PrfDime() >> Rdime() >> VectorScorer()
    """
    schematic = {'label': 'PRF-DIME'}

    def __init__(self, *, num_docs: int = 2, keep_ranking: bool = True):
        super().__init__(kernel='uniform', num_docs=num_docs, keep_ranking=keep_ranking)


class SwcDime(KernelDime):
    """SWC DIME: Kernel DIME with softmax weights ``softmax(q.d_i / tau)`` over the top-``num_docs`` documents
    (defaults 10 and 0.1, as in the RDIME code); an approximation of the inverse-variance weights.

    Input columns: ``qid, query_vec, docno, doc_vec, score``. Output columns: the input's plus ``query_dime``.

    Example::

        pipe = bm25 % 100 >> model.query_encoder() >> index.vec_loader() >> SwcDime() >> Rdime() >> VectorScorer()
    """
    schematic = {'label': 'SWC-DIME'}

    def __init__(self, *, num_docs: int = 10, tau: float = 0.1, keep_ranking: bool = True):
        super().__init__(kernel='softmax', num_docs=num_docs, tau=tau, keep_ranking=keep_ranking)


class MagnitudeDime(DimeScorer):
    """Magnitude DIME ``u = q * q``: needs no feedback.

    Input columns: ``qid, query_vec`` (a query or a result frame). Output columns: the input's plus ``query_dime``.
    """
    schematic = {'label': 'Magnitude'}

    def __init__(self, *, keep_ranking: bool = True):
        check_bool('MagnitudeDime', 'keep_ranking', keep_ranking)
        self.keep_ranking = keep_ranking

    def _validate(self, inp):
        pt.validate.columns(inp, includes=['qid', 'query_vec'], context=self)

    def _importance(self, inp, groups, query_vecs):
        return maths.magnitude_dime(query_vecs)


class LlmDime(DimeScorer):
    """LLM DIME: ``u = q * a`` where ``a`` is the embedding of an LLM-generated answer to the query.

    The answer comes as ``query_answer_vec`` (a precomputed vector) or as ``query_answer`` (text), which is encoded
    with ``encoder.encode_docs`` — pass the same pyterrier-dr bi-encoder that encodes the documents. A query with
    no answer (``None``, NaN, or empty text) falls back to ``u = q * q``, as in the reference code, with a warning.
    A malformed answer is an error naming the qid: a vector that is not 1-D, has the wrong length or holds NaN/inf,
    a non-text ``query_answer``, or an encoder that returns the wrong number of vectors or NaN/inf.

    Input columns: ``qid, query_vec`` and ``query_answer_vec`` or ``query_answer`` (query or result frame).
    Output columns: the input's plus ``query_dime``.

    Example::

        pipe = bm25 % 100 >> model.query_encoder() >> LlmAnswers.from_tsv('llm_answers.tsv') \\
            >> LlmDime(encoder=model) >> Rdime() >> index.vec_loader() >> VectorScorer()
    """
    schematic = {'label': 'LLM-DIME'}

    def __init__(self, *, encoder: Optional[object] = None, keep_ranking: bool = True):
        if encoder is not None and not callable(getattr(encoder, 'encode_docs', None)):
            raise ValueError(f'LlmDime: encoder {encoder!r} has no encode_docs(texts) method; pass a pyterrier-dr '
                             'BiEncoder such as pyterrier_dr.SBertBiEncoder(...)')
        check_bool('LlmDime', 'keep_ranking', keep_ranking)
        self.encoder = encoder
        self.keep_ranking = keep_ranking

    def _validate(self, inp):
        with pt.validate.any(inp, context=self) as v:
            v.columns(includes=['qid', 'query_vec', 'query_answer_vec'], mode='vector')
            v.columns(includes=['qid', 'query_vec', 'query_answer'], mode='text')

    def _importance(self, inp, groups, query_vecs):
        dims = query_vecs.shape[1]
        qids = inp['qid'].to_numpy()[groups.first_rows]
        answers = np.zeros_like(query_vecs)
        if 'query_answer_vec' in inp.columns:
            present = ~np.array([_missing(v) for v in inp['query_answer_vec'].to_numpy()[groups.first_rows]],
                                dtype=bool)
            if present.any():
                stacked = stack_vectors(inp, 'query_answer_vec', groups.first_rows[present], self, 'qid')
                check_same_dims(self, dims, stacked.shape[1], 'query_answer_vec', f' (qid={qids[present][0]!r})')
                answers[present] = stacked
        else:
            if self.encoder is None:
                raise ValueError('LlmDime: the input has query_answer text but no encoder was given; use '
                                 'LlmDime(encoder=model) with the bi-encoder of the documents, or supply '
                                 'query_answer_vec')
            texts = inp['query_answer'].to_numpy()[groups.first_rows]
            for qid, text in zip(qids, texts):
                if not isinstance(text, str) and not _missing(text):
                    raise ValueError(f'{self}: query_answer of qid={qid!r} is {text!r} ({type(text).__name__}), not '
                                     'text; give the answer as a string (or None when there is none)')
            present = np.array([isinstance(t, str) and t.strip() != '' for t in texts], dtype=bool)
            if present.any():
                answers[present] = self._encode(list(texts[present]), qids[present], dims)
        importance = query_vecs * answers
        return self._magnitude_fallback(importance, query_vecs, ~present, inp, groups, 'no LLM answer')

    def _encode(self, texts: list, qids: np.ndarray, dims: int) -> np.ndarray:
        encoded = np.asarray(self.encoder.encode_docs(texts))
        if encoded.ndim != 2 or encoded.shape[0] != len(texts):
            raise ValueError(f'{self}: {self.encoder!r}.encode_docs returned shape {encoded.shape} for {len(texts)} '
                             f'answer texts; it must return one vector per text, shape ({len(texts)}, {dims})')
        if encoded.dtype.kind not in 'biuf':
            raise ValueError(f'{self}: {self.encoder!r}.encode_docs returned {encoded.dtype} values, not real '
                             'numbers')
        encoded = encoded.astype(np.float64)
        check_same_dims(self, dims, encoded.shape[1], 'the encoded query_answer')
        finite = np.isfinite(encoded).all(axis=1)
        if not finite.all():
            raise ValueError(f'{self}: {self.encoder!r}.encode_docs returned NaN or inf for the query_answer of '
                             f'qid={qids[np.argmin(finite)]!r}; check the encoder (and the answer text)')
        return encoded


def _missing(value: object) -> bool:
    """No answer: None, pd.NA, or a NaN scalar (pandas' missing value)."""
    return value is None or value is pd.NA or (isinstance(value, float) and np.isnan(value))


class EclipseDime(DimeScorer):
    """Eclipse DIME: ``u = alpha * q * mean(top-num_pos docs) - beta * q * mean(bottom-num_neg docs)`` of the
    incoming ranking (defaults 2, 5, 1.0, 0.5 as in the Eclipse code). Negatives never include a positive.
    It needs the whole first ranking, so ``compile()`` does not cut it.

    Input columns: ``qid, query_vec, docno, doc_vec, score``. Output columns: the input's plus ``query_dime``.
    """
    schematic = {'label': 'Eclipse'}

    def __init__(self, *, num_pos: int = 2, num_neg: int = 5, alpha: float = 1.0, beta: float = 0.5,
                 keep_ranking: bool = True):
        check_int('EclipseDime', 'num_pos', num_pos, 1)
        check_int('EclipseDime', 'num_neg', num_neg, 1)
        check_nonnegative('EclipseDime', 'alpha', alpha)
        check_nonnegative('EclipseDime', 'beta', beta)
        check_bool('EclipseDime', 'keep_ranking', keep_ranking)
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


class OracleDime(DimeScorer):
    """Oracle DIME, an upper bound that reads the relevance judgments: per dimension ``j``, the Pearson correlation
    between the label and ``q_j * d_j`` over the judged documents of the incoming ranking. Queries where it is
    undefined (fewer than two judged documents, or all with one label) fall back to ``u = q * q`` with a warning.

    Args:
        qrels: judgments with columns ``qid, docno, label`` (as ``dataset.get_qrels()``).

    Input columns: ``qid, query_vec, docno, doc_vec, score``. Output columns: the input's plus ``query_dime``.
    """
    schematic = {'label': 'Oracle'}

    def __init__(self, *, qrels: pd.DataFrame, keep_ranking: bool = True):
        missing = {'qid', 'docno', 'label'} - set(getattr(qrels, 'columns', []))
        if missing:
            raise ValueError(f'OracleDime: qrels must be a DataFrame with columns qid, docno, label; missing '
                             f'{sorted(missing)}')
        check_bool('OracleDime', 'keep_ranking', keep_ranking)
        self.qrels = qrels
        self.keep_ranking = keep_ranking

    def _importance(self, inp, groups, query_vecs):
        keys = pd.MultiIndex.from_frame(inp[['qid', 'docno']].astype(str))
        judged = self.qrels.assign(qid=self.qrels['qid'].astype(str), docno=self.qrels['docno'].astype(str))
        labels = judged.drop_duplicates(['qid', 'docno']).set_index(['qid', 'docno'])['label']
        row_labels = labels.reindex(keys).to_numpy(dtype=np.float64)
        feedback = select_feedback(inp, groups, len(inp), self)  # every candidate: the width is capped per frame
        mask = feedback.mask & np.isfinite(row_labels[np.where(feedback.mask, feedback.rows, 0)])
        feedback = feedback._replace(mask=mask)
        doc_vecs = gather_vectors(inp, 'doc_vec', feedback, query_vecs.shape[1], self)
        slot_labels = np.where(mask, row_labels[np.where(mask, feedback.rows, 0)], 0.0)
        importance = maths.oracle_dime(query_vecs, doc_vecs, slot_labels, mask)
        undefined = np.isnan(importance).any(axis=1)
        return self._magnitude_fallback(np.nan_to_num(importance), query_vecs, undefined, inp, groups,
                                        'no oracle correlation (fewer than two judged candidates, or one label only)')


class FeedbackCutoff(ConfigTransformer):
    """Keeps the ``num_docs`` highest-``score`` rows of each query (ties keep input order): the feedback documents a
    DIME stage selects, so ``KernelDime(keep_ranking=False).compile()`` puts it first. Unlike ``pt.RankCutoff`` it
    does not read ``rank`` (0- or 1-based, or stale after a re-scoring); like it, ``compile()`` fuses it into a
    preceding retriever that supports a rank cutoff (the retriever then returns ``num_docs`` results).

    Input columns: ``qid, docno, score``. Output columns: the input's, rows in input order.
    """
    schematic = {'label': 'feedback cut'}

    def __init__(self, *, num_docs: int):
        check_int('FeedbackCutoff', 'num_docs', num_docs, 1)
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
