"""LLM DIME and LLM-Eclipse: the importance from the embedding of an LLM-generated answer."""
import warnings
from typing import Optional, Tuple

import numpy as np
import pandas as pd
import pyterrier as pt

from .. import maths
from .._config import check_bool, check_int, check_weights
from .._frames import QueryGroups, check_same_dims, gather_vectors, select_feedback, stack_vectors
from ._base import DimeScorer, some_queries


class LlmDime(DimeScorer):
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
        stage = type(self).__name__
        check_encoder(stage, encoder)
        check_bool(stage, 'keep_ranking', keep_ranking)
        self.encoder = encoder
        self.keep_ranking = keep_ranking

    def _validate(self, inp):
        validate_answers(inp, self, [])

    def _importance(self, inp, groups, query_vecs):
        answers, present = answer_vectors(self, self.encoder, inp, groups, query_vecs)
        importance = query_vecs * answers
        return self._magnitude_fallback(importance, query_vecs, ~present, inp, groups, 'no LLM answer'), {}


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
                          'as their positive (u = alpha * q * q - beta * q * mean(negatives))', stacklevel=2)
            answers = np.where(present[:, None], answers, query_vecs)
        neg = select_feedback(inp, groups, self.num_neg, self, from_bottom=True)
        one = np.ones((groups.size, 1), dtype=bool)
        return maths.eclipse_dime(query_vecs, answers[:, None, :], one,
                                  gather_vectors(inp, 'doc_vec', neg, query_vecs.shape[1], self), neg.mask,
                                  alpha=self.alpha, beta=self.beta), {}


def check_encoder(stage: str, encoder: Optional[object]) -> None:
    """None, or an object with ``encode_docs(texts)`` (a pyterrier-dr bi-encoder)."""
    if encoder is not None and not callable(getattr(encoder, 'encode_docs', None)):
        raise ValueError(f'{stage}: encoder {encoder!r} has no encode_docs(texts) method; pass a pyterrier-dr '
                         'BiEncoder such as pyterrier_dr.SBertBiEncoder(...)')


def validate_answers(inp: pd.DataFrame, stage: object, extra_columns: list) -> None:
    """The input has ``qid, query_vec`` and ``extra_columns``, and ``query_answer_vec`` or ``query_answer``."""
    with pt.validate.any(inp, context=stage) as v:
        v.columns(includes=['qid', 'query_vec', *extra_columns, 'query_answer_vec'], mode='vector')
        v.columns(includes=['qid', 'query_vec', *extra_columns, 'query_answer'], mode='text')


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
