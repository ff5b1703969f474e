"""Readers of UTF-8 lines and of ``qid<TAB>text`` files (LLM answers, queries), with errors naming file and line."""
import os
from pathlib import Path
from typing import Dict, Iterator, Tuple, Union


def utf8_lines(path: Union[str, os.PathLike], digest=None) -> Iterator[Tuple[int, str]]:
    """``(line number, line)`` of the non-blank lines of a UTF-8 file, without line ends or a leading byte-order
    mark; every byte read goes into the hashlib ``digest`` when given."""
    path = Path(path)
    with open(path, 'rb') as f:
        for line_no, raw in enumerate(f, start=1):
            if digest is not None:
                digest.update(raw)
            try:
                line = raw.decode('utf-8')
            except UnicodeDecodeError as e:
                raise ValueError(f'{path}:{line_no}: not UTF-8 (byte 0x{raw[e.start]:02x} at byte {e.start + 1} of '
                                 f'the line); convert the file to UTF-8, e.g. iconv -f latin1 -t utf-8 {path.name} '
                                 f'> {path.name}.utf8 if it is latin-1') from None
            if line_no == 1:
                line = line.removeprefix('\ufeff')
            line = line.rstrip('\r\n')
            if line.strip():
                yield line_no, line


def read_qid_tsv(path: Union[str, os.PathLike], *, what: str, allow_empty: bool) -> Dict[str, str]:
    """``{qid: text}`` from ``qid<TAB><what>`` lines, in file order (further tabs belong to the text). A line without
    a tab, a qid that is empty, holds whitespace or comes twice, and (unless ``allow_empty``) an empty text are a
    ValueError naming the file, the line and the fix."""
    path = Path(path)
    rows: Dict[str, str] = {}
    first_line: Dict[str, int] = {}
    for line_no, line in utf8_lines(path):
        qid, tab, text = line.partition('\t')
        if not tab:
            raise ValueError(f'{path}:{line_no}: no tab in {line[:80]!r}; each line of {path.name} is '
                             f'qid<TAB>{what}')
        if not qid or qid.split() != [qid]:
            raise ValueError(f'{path}:{line_no}: qid {qid!r} is empty or holds whitespace, so the qrels '
                             '(whitespace-separated) could never judge it; write the qid without spaces, then a '
                             'tab')
        if not allow_empty and not text.strip():
            raise ValueError(f'{path}:{line_no}: qid {qid!r} has an empty {what}; write its text after the tab or '
                             'remove the line')
        if (earlier := first_line.setdefault(qid, line_no)) != line_no:
            raise ValueError(f'{path}:{line_no}: qid {qid!r} is also on line {earlier}; give each qid one {what}, or '
                             'remove the repeated line')
        rows[qid] = text
    return rows
