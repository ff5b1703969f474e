"""LLM answers for LLM DIME: a stage that adds the generated answer of each query as ``query_answer``."""
import math
import os
import warnings
from typing import Dict, Mapping, Union

import pandas as pd
import pyterrier as pt

from .._config import ConfigTransformer, check_choice
from .._frames import check_qids, check_qids_written_alike
from .._tsv import read_qid_tsv


def read_answers_tsv(path: Union[str, os.PathLike]) -> Dict[str, str]:
    """Read ``qid<TAB>answer`` lines (no header, UTF-8; a byte-order mark is skipped) into a dict.

    An answer may contain further tabs, or be empty (no answer); blank lines are skipped. A line without a tab, a
    qid that is empty or holds whitespace, a qid given twice or a file that is not UTF-8 is a ValueError naming the
    file and line (see :func:`pyterrier_rdime._tsv.read_qid_tsv`, which also reads a collection's queries).
    """
    return read_qid_tsv(path, what='answer', allow_empty=True)


class LlmAnswers(ConfigTransformer):
    """Adds ``query_answer``, an LLM-generated answer per query, from a qid -> text mapping (see :meth:`from_tsv`).

    A query without an answer gets ``None``; :class:`~pyterrier_rdime.LlmDime` then falls back to ``u = q * q`` for
    it and warns (with ``missing='error'`` this stage raises instead). When no query of a frame has an answer, this
    stage warns too.

    Qids match as PyTerrier compares them, as strings (``str(qid)`` of the input). An integer qid written as a float
    on one side only (``'1.0'`` against ``'1'``: pandas reads a column of integers with a gap as floats) would match
    nothing; it is an error naming both forms.

    Input columns: ``qid`` (query or result frame). Output columns: the input's plus ``query_answer``.

    Example::

        pipe = model.query_encoder() >> LlmAnswers.from_tsv('llm_answers.tsv') >> LlmDime(encoder=model)
    """
    schematic = {'label': 'LLM answers'}

    def __init__(self, *, answers: Mapping[str, str], missing: str = 'fallback'):
        """
        Args:
            answers: qid -> answer text (``None`` or NaN for a query without an answer); qids are strings, as in
                PyTerrier frames.
            missing: ``'fallback'``: a query without an answer gets ``None``; ``'error'``: raise.
        """
        stage = type(self).__name__
        if not isinstance(answers, Mapping):
            raise ValueError(f'{stage}: answers must be a mapping qid -> answer text, got '
                             f'{type(answers).__name__}; use LlmAnswers.from_tsv(path) for a file, or dict(...) / '
                             'series.to_dict() for other containers')
        for qid, text in answers.items():
            if not isinstance(qid, str):
                raise ValueError(f'{stage}: answers has the qid {qid!r} ({type(qid).__name__}), but qids are '
                                 'strings in PyTerrier frames; use {str(qid): text for qid, text in answers.items()}')
            if not (isinstance(text, str) or text is None or (isinstance(text, float) and math.isnan(text))):
                raise ValueError(f'{stage}: the answer of qid {qid!r} is {text!r} ({type(text).__name__}), not '
                                 'text; give a string, or None for no answer')
        check_choice(stage, 'missing', missing, ('fallback', 'error'))
        self.answers = answers
        self.missing = missing

    @classmethod
    def from_tsv(cls, path: Union[str, os.PathLike], *, missing: str = 'fallback') -> 'LlmAnswers':
        """Answers from a ``qid<TAB>answer`` file, such as ``llm_answers.tsv`` of msmarco-dl19-pool."""
        return cls(answers=read_answers_tsv(path), missing=missing)

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        pt.validate.columns(inp, includes=['qid'], context=self)
        check_qids(inp, self)
        qids = inp['qid'].astype(str)
        unique = qids.unique()
        unknown = [qid for qid in unique if qid not in self.answers]
        check_qids_written_alike(unknown, self.answers, self, 'the answers',
                                 "e.g. pd.read_csv(..., dtype={'qid': str}), or LlmAnswers.from_tsv(path)")
        if unknown and len(unknown) == len(unique) and self.missing == 'fallback':
            warnings.warn(f'{self}: no query of the input has an answer ({len(unique)} qid(s), e.g. {unique[0]!r}; '
                          f'the answers have {len(self.answers)} qid(s)'
                          f'{", e.g. " + repr(next(iter(self.answers))) if self.answers else ""}): every '
                          'query_answer is None; check that the answers are for these queries', stacklevel=2)
        answers = qids.map(self.answers)
        if self.missing == 'error' and answers.isna().any():
            qids = inp['qid'][answers.isna()].unique()
            raise ValueError(f'{self}: no answer for qid {", ".join(map(repr, qids[:5]))}'
                             f'{" ..." if len(qids) > 5 else ""}; add them to the answers or use missing="fallback"')
        return inp.assign(query_answer=answers.astype(object).where(answers.notna(), None))

