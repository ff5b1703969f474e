"""LLM DIME: the importance from the embedding of an LLM-generated answer."""
from typing import Optional

import numpy as np
import pandas as pd
import pyterrier as pt

from .._config import check_bool
from .._frames import check_same_dims, stack_vectors
from ._base import DimeScorer


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
        stage = type(self).__name__
        if encoder is not None and not callable(getattr(encoder, 'encode_docs', None)):
            raise ValueError(f'{stage}: encoder {encoder!r} has no encode_docs(texts) method; pass a pyterrier-dr '
                             'BiEncoder such as pyterrier_dr.SBertBiEncoder(...)')
        check_bool(stage, 'keep_ranking', keep_ranking)
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
                raise ValueError(f'{self}: the input has query_answer text but no encoder was given; use '
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
