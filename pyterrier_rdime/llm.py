"""LLM answers for LLM DIME: a stage that adds the generated answer of each query as ``query_answer``."""
import csv
import os
from typing import Dict, Mapping, Union

import pandas as pd
import pyterrier as pt

from ._config import ConfigTransformer


def read_answers_tsv(path: Union[str, os.PathLike]) -> Dict[str, str]:
    """Read ``qid<TAB>answer`` lines (no header) into a dict; a qid given twice is an error."""
    answers: Dict[str, str] = {}
    with open(path, newline='', encoding='utf-8') as f:
        for line_no, row in enumerate(csv.reader(f, delimiter='\t', quoting=csv.QUOTE_NONE), start=1):
            if not row:
                continue
            if len(row) < 2:
                raise ValueError(f'{path}:{line_no}: expected qid<TAB>answer, got {row!r}')
            qid, answer = row[0], '\t'.join(row[1:])
            if qid in answers:
                raise ValueError(f'{path}:{line_no}: qid {qid!r} has a second answer')
            answers[qid] = answer
    return answers


class LlmAnswers(ConfigTransformer):
    """Adds ``query_answer``, an LLM-generated answer per query, from a qid -> text mapping (see :meth:`from_tsv`).

    A query without an answer gets ``None``; :class:`~pyterrier_rdime.LlmDime` then falls back to ``u = q * q`` for
    it and warns (with ``missing='error'`` this stage raises instead).

    Input columns: ``qid`` (query or result frame). Output columns: the input's plus ``query_answer``.

    Example::

        pipe = model.query_encoder() >> LlmAnswers.from_tsv('llm_answers.tsv') >> LlmDime(encoder=model)
    """
    schematic = {'label': 'LLM answers'}

    def __init__(self, *, answers: Mapping[str, str], missing: str = 'fallback'):
        if missing not in ('fallback', 'error'):
            raise ValueError(f"LlmAnswers: missing must be 'fallback' or 'error', got {missing!r}")
        self.answers = answers
        self.missing = missing

    @classmethod
    def from_tsv(cls, path: Union[str, os.PathLike], *, missing: str = 'fallback') -> 'LlmAnswers':
        """Answers from a ``qid<TAB>answer`` file, such as ``llm_answers.tsv`` of msmarco-dl19-pool."""
        return cls(answers=read_answers_tsv(path), missing=missing)

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        pt.validate.columns(inp, includes=['qid'], context=self)
        answers = inp['qid'].astype(str).map(self.answers)
        if self.missing == 'error' and answers.isna().any():
            qids = inp['qid'][answers.isna()].unique()
            raise ValueError(f'{self}: no answer for qid {", ".join(map(repr, qids[:5]))}'
                             f'{" ..." if len(qids) > 5 else ""}; add them to the answers or use missing="fallback"')
        return inp.assign(query_answer=answers.astype(object).where(answers.notna(), None))
