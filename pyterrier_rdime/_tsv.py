"""The one reader of UTF-8 lines with errors naming file and line, and of ``qid<TAB>text`` files (LLM answers, a
collection's queries) on top of it."""
import os
from pathlib import Path
from typing import Dict, Iterator, Tuple, Union


def utf8_lines(path: Union[str, os.PathLike], digest=None) -> Iterator[Tuple[int, str]]:
    """The non-blank lines of a UTF-8 file (a leading byte-order mark skipped), without line ends, with their 1-based
    line numbers; every byte read goes into the hashlib object ``digest`` when one is given. A byte that is not UTF-8
    is a ValueError naming the file, the line and the fix."""
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
    """Read ``qid<TAB><what>`` lines (UTF-8, no header; a leading byte-order mark is skipped) into a dict, in file
    order. Further tabs belong to the text; blank lines are skipped; ``\\r\\n`` line ends are fine.

    A ValueError names the file and line, and says how to fix it, for: a byte that is not UTF-8, a line without a
    tab, a qid that is empty or holds whitespace (qrels and runs are whitespace-separated: such a qid could never be
    judged), a qid given twice, and, unless ``allow_empty``, an empty text.
    """
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
        if qid in first_line:
            raise ValueError(f'{path}:{line_no}: qid {qid!r} is also on line {first_line[qid]}; give each qid one '
                             f'{what}, or remove the repeated line')
        first_line[qid] = line_no
        rows[qid] = text
    return rows
