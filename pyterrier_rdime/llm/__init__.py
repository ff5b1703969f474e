"""LLM answers for LLM DIME, added as ``query_answer``: read from a file (:class:`LlmAnswers`: ``qid<TAB>answer``, or
the published CSV ``qid,query,answer``), published by name (:meth:`LlmAnswers.published`) or generated
(:class:`LlmGenerator`)."""
import csv
import io
import math
import os
import warnings
from pathlib import Path
from typing import Dict, Mapping, Optional, Union

import pandas as pd
import pyterrier as pt

from .._config import ConfigTransformer, check_choice, default_cache_dir
from .._frames import check_qids, check_qids_written_alike, float_twin
from .._tsv import read_qid_tsv, utf8_lines
from .generator import LlmGenerator, smollm2_gguf_path

__all__ = ['LlmAnswers', 'read_answers_tsv', 'read_answers_csv', 'LlmGenerator', 'smollm2_gguf_path']

#: The first fields of a header row of a published CSV (DIME's gpt4_answers.csv: ``query_id,text,response``).
_CSV_HEADERS = ('qid', 'query_id')


def read_answers_tsv(path: Union[str, os.PathLike]) -> Dict[str, str]:
    """Read ``qid<TAB>answer`` lines (no header, UTF-8) into a dict; an answer may hold tabs or be empty. A bad line,
    a repeated qid or a qid written as a float is a ValueError naming the file and line."""
    answers = read_qid_tsv(path, what='answer', allow_empty=True)
    floats = [qid for qid in answers if '.' in qid and float_twin(qid) is not None]
    if floats:
        line_no = next(n for n, line in utf8_lines(path) if line.partition('\t')[0] == floats[0])
        raise ValueError(f'{path}:{line_no}: qid {floats[0]!r} is an integer written as a float, which matches no '
                         f'query (qids are compared as written); write it as {float_twin(floats[0])!r} (a file '
                         "written by pandas: read the qids with dtype={'qid': str})")
    return answers


def read_answers_csv(path: Union[str, os.PathLike]) -> Dict[str, str]:
    """Read a published answers file (CSV ``qid,query,answer``, UTF-8) into a dict qid -> answer, in file order; a
    header row is skipped. A bad row, an empty or repeated qid or a float qid is a ValueError naming the file and line.
    """
    path = Path(path)
    try:
        text = path.read_bytes().decode('utf-8-sig')
    except UnicodeDecodeError as e:
        line_no = path.read_bytes()[:e.start].count(b'\n') + 1
        raise ValueError(f'{path}:{line_no}: not UTF-8; convert the file to UTF-8') from None
    reader = csv.reader(io.StringIO(text, newline=''), strict=True)
    answers: Dict[str, str] = {}
    first_line: Dict[str, int] = {}
    end = 0  # the last line of the record before
    try:
        for row in reader:
            start, end = end + 1, reader.line_num
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            if start == 1 and row[0].strip().lower() in _CSV_HEADERS:
                continue
            if len(row) != 3:
                raise ValueError(f'{path}:{start}: {len(row)} fields in {",".join(row)[:80]!r}; each record is '
                                 'qid,query,"answer" (quote a field that holds a comma, a quote or a line break)')
            qid, _, answer = row
            if not qid or qid.split() != [qid]:
                raise ValueError(f'{path}:{start}: qid {qid!r} is empty or holds whitespace; each record is '
                                 'qid,query,"answer"')
            if '.' in qid and float_twin(qid) is not None:
                raise ValueError(f'{path}:{start}: qid {qid!r} is an integer written as a float, which matches no '
                                 f'query; write it as {float_twin(qid)!r}')
            if qid in first_line:
                raise ValueError(f'{path}:{start}: qid {qid!r} is also on line {first_line[qid]}; give each qid one '
                                 'answer')
            first_line[qid] = start
            answers[qid] = answer
    except csv.Error as e:
        raise ValueError(f'{path}:{reader.line_num}: {e}; each record is qid,query,"answer" with any " in a quoted '
                         'field doubled') from None
    return answers


def missing_answers(answers: Mapping[str, Optional[str]], qids) -> list:
    """The qids of ``qids`` (in their order) that ``answers`` does not answer (absent, ``None`` or blank)."""
    return [qid for qid in dict.fromkeys(qids)
            if not isinstance(answers.get(qid), str) or not answers[qid].strip()]


class LlmAnswers(ConfigTransformer):
    """Adds ``query_answer``, an LLM-generated answer per query, from a qid -> text mapping (see :meth:`from_tsv`).

    A query without an answer gets ``None``, and :class:`~pyterrier_rdime.LlmDime` falls back to ``u = q * q`` with
    a warning (``missing='error'``: raise). Qids match as strings; ``'1.0'`` against ``'1'`` is an error.

    Args:
        answers: qid -> answer text (``None`` or NaN for a query without an answer); qids are strings, as in
            PyTerrier frames.
        missing: ``'fallback'``: a query without an answer gets ``None``; ``'error'``: raise.

    Input columns: ``qid`` (query or result frame). Output columns: the input's plus ``query_answer``.

    Example::

        pipe = model.query_encoder() >> LlmAnswers.from_tsv('llm_answers.tsv') >> LlmDime(encoder=model)
    """
    schematic = {'label': 'LLM answers'}

    def __init__(self, *, answers: Mapping[str, str], missing: str = 'fallback'):
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
        super().__init__(answers=answers, missing=missing)

    @classmethod
    def from_tsv(cls, path: Union[str, os.PathLike], *, missing: str = 'fallback') -> 'LlmAnswers':
        """Answers from a ``qid<TAB>answer`` file, such as ``llm_answers.tsv`` of msmarco-dl19-pool."""
        return cls(answers=read_answers_tsv(path), missing=missing)

    @classmethod
    def published(cls, name: str, dataset: str, *, cache: Optional[Union[str, os.PathLike]] = None,
                  missing: str = 'fallback') -> 'LlmAnswers':
        """Published answers ``name`` (e.g. ``'gpt-4'``; see :data:`~pyterrier_rdime.llm.published.CATALOGUE`) for
        the ir_datasets query set ``dataset``, downloaded once into the cache folder and checked on every use.
        """
        from .published import fetch, published_entry
        entry = published_entry(name, dataset)
        path = fetch(entry, default_cache_dir() if cache is None else cache)
        return cls(answers=read_answers_csv(path), missing=missing)

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

