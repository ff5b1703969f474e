"""DIME scorers: PyTerrier stages that add the per-query dimension importance ``query_dime`` (from feedback documents,
an LLM answer or the relevance judgments), and the cutoff to their feedback documents."""
import warnings
from typing import Any, Dict, Optional, Tuple, Union

import numpy as np
import pandas as pd
import pyterrier as pt

from . import maths
from ._config import ConfigTransformer, check_bool, check_choice, check_int, check_positive, check_weights
from ._frames import (
    Feedback,
    QueryGroups,
    check_qids_written_alike,
    check_same_dims,
    empty_frame,
    gather_vectors,
    group_queries,
    numeric_column,
    per_row,
    query_vectors,
    select_feedback,
    stack_vectors,
)

__all__ = ['DimeScorer', 'KernelDime', 'PrfDime', 'SwcDime', 'FeedbackCutoff', 'MagnitudeDime', 'LlmDime',
           'EclipseDime', 'LlmEclipseDime', 'OracleDime', 'ActiveFeedbackDime']


class DimeScorer(ConfigTransformer):
    """Base of the DIME scorers: adds ``query_dime``, each query's importance vector (float32, or float64 where
    float32 would flush it to 0). ``keep_ranking=True`` keeps every row (re-ranking); ``False`` returns one row per
    query with its query columns, for a retriever (as pyterrier-dr's ``VectorPrf``)."""

    def __init__(self, *, keep_ranking: bool = True, **options: Any):
        check_bool(type(self).__name__, 'keep_ranking', keep_ranking)
        super().__init__(keep_ranking=keep_ranking, **options)

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        self._validate(inp)
        carried = set(inp.columns if self.keep_ranking else pt.model.query_columns(inp))  # kept in the input's order
        added = ('query_dime',) + self._extra_columns()
        columns = [c for c in inp.columns if c in carried and c not in added] + list(added)
        if not len(inp):
            return empty_frame(inp, columns)
        inp = inp.reset_index(drop=True)
        groups = group_queries(inp, self)
        query_vecs = query_vectors(inp, 'query_vec', groups, self)
        importance, extra = self._importance(inp, groups, query_vecs)
        bad = ~(np.abs(importance) <= np.finfo(np.float32).max)  # overflows float32 (or NaN): say so, not as inf later
        if bad.any():
            row = int(np.argmax(bad.any(axis=1)))
            peak = np.abs(importance[row])
            peak = f'{peak[~np.isnan(peak)].max():.3g}' if not np.isnan(peak).all() else 'NaN'
            raise ValueError(f'{self}: query_dime of qid={inp["qid"].iloc[groups.first_rows[row]]!r} reaches '
                             f'{peak}, beyond float32 (max {np.finfo(np.float32).max:.3g}); its query_vec has '
                             f'values up to {np.abs(query_vecs[row]).max():.3g}. Normalise the query and document '
                             'vectors (e.g. to unit length) before this stage')
        tiny = (importance != 0) & (np.abs(importance) < np.finfo(np.float32).tiny)  # float32 would flush them to 0
        importance = importance.astype(np.float64 if tiny.any() else np.float32)
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
        super().__init__(keep_ranking=keep_ranking)

    def _validate(self, inp):
        pt.validate.columns(inp, includes=['qid', 'query_vec'], context=self)

    def _importance(self, inp, groups, query_vecs):
        return maths.magnitude_dime(query_vecs), {}


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
        super().__init__(kernel=kernel, num_docs=num_docs, tau=tau, keep_ranking=keep_ranking)

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
        super().__init__(num_pos=num_pos, num_neg=num_neg, alpha=alpha, beta=beta, keep_ranking=keep_ranking)

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
        super().__init__(num_docs=num_docs)

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


class _AnswerDime(DimeScorer):
    """Base of the scorers that read each query's LLM answer (:func:`answer_vectors`) and, besides, the result
    columns ``_feedback_columns``."""
    _feedback_columns: Tuple[str, ...] = ()

    def __init__(self, *, encoder: Optional[object] = None, keep_ranking: bool = True, **options: Any):
        if encoder is not None and not callable(getattr(encoder, 'encode_docs', None)):
            raise ValueError(f'{type(self).__name__}: encoder {encoder!r} has no encode_docs(texts) method; pass a '
                             'pyterrier-dr BiEncoder such as pyterrier_dr.SBertBiEncoder(...)')
        super().__init__(encoder=encoder, keep_ranking=keep_ranking, **options)

    def _validate(self, inp):
        with pt.validate.any(inp, context=self) as v:
            v.columns(includes=['qid', 'query_vec', *self._feedback_columns, 'query_answer_vec'], mode='vector')
            v.columns(includes=['qid', 'query_vec', *self._feedback_columns, 'query_answer'], mode='text')


class LlmDime(_AnswerDime):
    """LLM DIME: ``u = q * a``, ``a`` the embedding of an LLM-generated answer: ``query_answer_vec``, or
    ``query_answer`` text encoded by ``encoder.encode_docs`` (the documents' pyterrier-dr bi-encoder). A query
    without an answer falls back to ``u = q * q`` with a warning; a malformed answer is an error naming the qid.

    Input columns: ``qid, query_vec`` and ``query_answer_vec`` or ``query_answer`` (query or result frame).
    Output columns: the input's plus ``query_dime``.

    Example::

        pipe = bm25 % 100 >> model.query_encoder() >> LlmAnswers.from_tsv('llm_answers.tsv') \\
            >> LlmDime(encoder=model) >> Rdime() >> index.vec_loader() >> VectorScorer()
    """
    schematic = {'label': 'LLM-DIME'}

    def __init__(self, *, encoder: Optional[object] = None, keep_ranking: bool = True):
        super().__init__(encoder=encoder, keep_ranking=keep_ranking)

    def _importance(self, inp, groups, query_vecs):
        answers, present = answer_vectors(self, self.encoder, inp, groups, query_vecs)
        return self._magnitude_fallback(query_vecs * answers, query_vecs, ~present, inp, groups, 'no LLM answer'), {}


class LlmEclipseDime(_AnswerDime):
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
    _feedback_columns = ('docno', 'doc_vec', 'score')

    def __init__(self, *, encoder: Optional[object] = None, num_neg: int = 5, alpha: float = 1.0, beta: float = 0.5,
                 keep_ranking: bool = True):
        stage = type(self).__name__
        check_int(stage, 'num_neg', num_neg, 1)
        check_weights(stage, alpha, beta, 'the answer', 'the negatives')
        super().__init__(encoder=encoder, num_neg=num_neg, alpha=alpha, beta=beta, keep_ranking=keep_ranking)

    def _importance(self, inp, groups, query_vecs):
        answers, present = answer_vectors(self, self.encoder, inp, groups, query_vecs)
        if not present.all():
            warnings.warn(f'{self}: no LLM answer for {some_queries(inp, groups, ~present)}; using the query itself '
                          'as their positive (u = alpha * q * q - beta * q * mean(negatives))', stacklevel=2)
            answers = np.where(present[:, None], answers, query_vecs)
        neg = select_feedback(inp, groups, self.num_neg, self, from_bottom=True)
        one = np.ones((groups.size, 1), dtype=bool)
        return maths.eclipse_dime(query_vecs, answers[:, None, :], one,
                                  gather_vectors(inp, 'doc_vec', neg, query_vecs.shape[1], self), neg.mask,
                                  alpha=self.alpha, beta=self.beta), {}


class OracleDime(DimeScorer):
    """Oracle DIME, an upper bound that reads the judgments (``qrels``: ``qid, docno, label``): per dimension ``j``,
    the Pearson correlation of the label with ``q_j * d_j`` over the judged candidates. Where it is undefined
    (fewer than two judged, or one label), ``u = q * q`` with a warning.

    ``pad_negatives=True`` labels 0 random unjudged candidates (as many as it has judged; seeded by ``seed`` and the
    qid) of a query with relevant but no non-relevant judged candidate, as DIME-SIGIR-2024's issue #3 advises; the
    column ``query_padded`` counts them (pt_docs/dime.rst).

    Input columns: ``qid, query_vec, docno, doc_vec, score``. Output columns: the input's plus ``query_dime`` (and
    ``query_padded`` with ``pad_negatives=True``).
    """
    schematic = {'label': 'Oracle'}

    def __init__(self, *, qrels: pd.DataFrame, pad_negatives: bool = False, seed: int = 0,
                 keep_ranking: bool = True):
        stage = type(self).__name__
        check_qrels(qrels, stage)
        check_bool(stage, 'pad_negatives', pad_negatives)
        check_int(stage, 'seed', seed, 0, 'the seed of the padding draws')
        super().__init__(qrels=qrels, pad_negatives=pad_negatives, seed=seed, keep_ranking=keep_ranking)

    def _extra_columns(self):
        return ('query_padded',) if self.pad_negatives else ()

    def _importance(self, inp, groups, query_vecs):
        row_labels = candidate_labels(inp, self.qrels, self)
        extra = {}
        if self.pad_negatives:
            row_labels, extra['query_padded'] = self._pad(inp, groups, row_labels)
        ranked = select_feedback(inp, groups, len(inp), self)  # every candidate
        slot_labels = np.where(ranked.mask, row_labels[np.where(ranked.mask, ranked.rows, 0)], np.nan)
        judged = ranked._replace(mask=np.isfinite(slot_labels))
        doc_vecs = gather_vectors(inp, 'doc_vec', judged, query_vecs.shape[1], self)
        importance = maths.oracle_dime(query_vecs, doc_vecs, slot_labels, judged.mask)
        undefined = np.isnan(importance).any(axis=1)
        importance = self._magnitude_fallback(np.nan_to_num(importance), query_vecs, undefined, inp, groups,
                                              'no oracle correlation (fewer than two judged candidates, or one '
                                              'label only)')
        return importance, extra

    def _pad(self, inp, groups, row_labels):
        """Label 0 a random draw of unjudged candidates of each query that needs it, from its unjudged docnos in
        sorted order (so that the row order does not matter)."""
        judged = np.isfinite(row_labels)
        relevant = np.bincount(groups.codes, weights=judged & (row_labels > 0), minlength=groups.size)
        non_relevant = np.bincount(groups.codes, weights=judged & (row_labels <= 0), minlength=groups.size)
        needs = (relevant > 0) & (non_relevant == 0)
        padded = np.zeros(groups.size, dtype=np.int64)
        if not needs.any():
            return row_labels, padded
        row_labels = row_labels.copy()
        unjudged = np.flatnonzero(~judged & needs[groups.codes])
        unjudged = unjudged[np.lexsort((inp['docno'].to_numpy()[unjudged].astype(str), groups.codes[unjudged]))]
        bounds = np.searchsorted(groups.codes[unjudged], np.arange(groups.size + 1))
        qids = inp['qid'].to_numpy()[groups.first_rows]
        for query in np.flatnonzero(needs):
            pool = unjudged[bounds[query]:bounds[query + 1]]
            take = int(min(relevant[query], len(pool)))  # as many as it has judged: all relevant
            chosen = pool[maths.query_rng(self.seed, str(qids[query])).choice(len(pool), take, replace=False)]
            row_labels[chosen] = 0.0
            padded[query] = take
        if (padded > 0).any():
            warnings.warn(f'{self}: {some_queries(inp, groups, padded > 0)} had relevant but no non-relevant judged '
                          'candidate; padded with random unjudged candidates labelled 0 (see query_padded)',
                          stacklevel=4)
        return row_labels, padded


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
        super().__init__(qrels=qrels, alpha=alpha, beta=beta, keep_ranking=keep_ranking)

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
                              'no negative term for them', stacklevel=3)
        importance = maths.eclipse_dime(query_vecs, gather_vectors(inp, 'doc_vec', pos, dims, self), pos.mask,
                                        gather_vectors(inp, 'doc_vec', neg, dims, self), neg.mask,
                                        alpha=self.alpha, beta=self.beta)
        return self._magnitude_fallback(importance, query_vecs, ~pos.mask[:, 0], inp, groups,
                                        'no judged relevant candidate'), {}


def some_queries(inp: pd.DataFrame, groups: QueryGroups, which: np.ndarray) -> str:
    """``2 queries ('q1', 'q2')``: the queries flagged in ``which`` (the first five shown), for a warning."""
    qids = inp['qid'].to_numpy()[groups.first_rows[which]]
    shown = ', '.join(map(repr, qids[:5])) + (' ...' if len(qids) > 5 else '')
    return f'{len(qids)} quer{"y" if len(qids) == 1 else "ies"} ({shown})'


def answer_vectors(stage: object, encoder: Optional[object], inp: pd.DataFrame, groups: QueryGroups,
                   query_vecs: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """``(answers (n, p), present (n,))``: each query's answer embedding from ``query_answer_vec`` or by encoding
    ``query_answer`` (zeros where none); malformed answers raise, naming ``stage`` and the qid."""
    dims = query_vecs.shape[1]
    qids = inp['qid'].to_numpy()[groups.first_rows]
    answers = np.zeros_like(query_vecs)
    if 'query_answer_vec' in inp.columns:
        present = ~np.array([_missing(v) for v in inp['query_answer_vec'].to_numpy()[groups.first_rows]],
                            dtype=bool)
        if present.any():
            stacked = stack_vectors(inp, 'query_answer_vec', groups.first_rows[present], stage, 'qid')
            check_same_dims(stage, dims, stacked.shape[1], 'query_answer_vec', f' (qid={qids[present][0]!r})')
            answers[present] = stacked
        return answers, present
    if encoder is None:
        raise ValueError(f'{stage}: the input has query_answer text but no encoder was given; use '
                         f'{type(stage).__name__}(encoder=model) with the bi-encoder of the documents, or supply '
                         'query_answer_vec')
    texts = inp['query_answer'].to_numpy()[groups.first_rows]
    for qid, text in zip(qids, texts):
        if not isinstance(text, str) and not _missing(text):
            raise ValueError(f'{stage}: query_answer of qid={qid!r} is {text!r} ({type(text).__name__}), not '
                             'text; give the answer as a string (or None when there is none)')
    present = np.array([isinstance(t, str) and t.strip() != '' for t in texts], dtype=bool)
    if present.any():
        answers[present] = _encode(stage, encoder, list(texts[present]), qids[present], dims)
    return answers, present


def _encode(stage: object, encoder: object, texts: list, qids: np.ndarray, dims: int) -> np.ndarray:
    encoded = np.asarray(encoder.encode_docs(texts))
    if encoded.ndim != 2 or encoded.shape[0] != len(texts):
        raise ValueError(f'{stage}: {encoder!r}.encode_docs returned shape {encoded.shape} for {len(texts)} '
                         f'answer texts; it must return one vector per text, shape ({len(texts)}, {dims})')
    if encoded.dtype.kind not in 'biuf':
        raise ValueError(f'{stage}: {encoder!r}.encode_docs returned {encoded.dtype} values, not real '
                         'numbers')
    encoded = encoded.astype(np.float64)
    check_same_dims(stage, dims, encoded.shape[1], 'the encoded query_answer')
    finite = np.isfinite(encoded).all(axis=1)
    if not finite.all():
        raise ValueError(f'{stage}: {encoder!r}.encode_docs returned NaN or inf for the query_answer of '
                         f'qid={qids[np.argmin(finite)]!r}; check the encoder (and the answer text)')
    return encoded


def _missing(value: object) -> bool:
    """No answer: None, pd.NA, or a NaN scalar (pandas' missing value)."""
    return value is None or value is pd.NA or (isinstance(value, float) and np.isnan(value))


def _one(ranked: Feedback, slot: np.ndarray, found: np.ndarray) -> Feedback:
    """One feedback document per query: the row at ``slot`` of the ranked candidates, where ``found``."""
    rows = np.where(found, ranked.rows[np.arange(len(slot)), slot], -1)[:, None]
    return Feedback(rows, rows >= 0)


def check_qrels(qrels: pd.DataFrame, stage: str) -> None:
    """A frame of judgments: columns ``qid, docno, label``, finite numeric labels, one per (qid, docno) (else a text
    label fails late, a NaN or a second label is lost)."""
    missing = {'qid', 'docno', 'label'} - set(getattr(qrels, 'columns', []))
    if missing:
        raise ValueError(f'{stage}: qrels must be a DataFrame with columns qid, docno, label; missing '
                         f'{sorted(missing)}')
    labels = numeric_column(qrels, 'label', stage, 'labels are relevance grades: convert the column '
                            "(qrels.assign(label=pd.to_numeric(qrels['label'])))")
    finite = np.isfinite(labels)
    if not finite.all():
        row = int(np.argmin(finite))
        raise ValueError(f"{stage}: qrels label is {labels[row]} at qid={qrels['qid'].iloc[row]!r}, "
                         f"docno={qrels['docno'].iloc[row]!r}; every judgment needs a finite label: fix or drop "
                         "those rows (qrels.dropna(subset=['label']))")
    keys = qrels[['qid', 'docno']].astype(str).assign(label=labels).drop_duplicates()
    conflicting = keys.duplicated(['qid', 'docno'])
    if conflicting.any():
        qid, docno = keys[conflicting].iloc[0][['qid', 'docno']]
        given = sorted(map(float, keys.loc[(keys['qid'] == qid) & (keys['docno'] == docno), 'label'].unique()))
        raise ValueError(f'{stage}: qrels judge qid={qid!r}, docno={docno!r} twice with different labels {given}; '
                         'keep one judgment per query and document')


def candidate_labels(inp: pd.DataFrame, qrels: pd.DataFrame, stage: object) -> np.ndarray:
    """The label of each row of ``inp`` (float64), NaN where not judged; a qid the qrels write as a float (``'1'``
    against ``'1.0'``), or the other way round, is an error."""
    keys = pd.MultiIndex.from_frame(inp[['qid', 'docno']].astype(str))
    judged = qrels.assign(qid=qrels['qid'].astype(str), docno=qrels['docno'].astype(str))
    check_qids_written_alike(keys.unique(level='qid'), set(judged['qid']), stage, 'the qrels',
                             "e.g. qrels.assign(qid=qrels['qid'].astype(int).astype(str))")
    labels = judged.drop_duplicates(['qid', 'docno']).set_index(['qid', 'docno'])['label']
    return labels.reindex(keys).to_numpy(dtype=np.float64)
