"""The stages' input edges: stacking vector columns with clear errors, grouping rows by query, qids as written, and
the readers of UTF-8 lines and of ``qid<TAB>text`` files (LLM answers, queries), with errors naming file and line."""
import os
import re
import warnings
from pathlib import Path
from typing import Collection, Dict, Iterable, Iterator, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
import pandas as pd

_COMPLEX_WARNING = getattr(getattr(np, 'exceptions', np), 'ComplexWarning')


def stack_vectors(inp: pd.DataFrame, column: str, rows: np.ndarray, stage: object, id_column: str) -> np.ndarray:
    """``inp[column]`` at positions ``rows`` as a float64 (len(rows), p) array; a value that is not a finite 1-D real
    vector of the common length is a ValueError naming ``stage``, the column and the row's ``id_column``."""
    values = inp[column].to_numpy()[rows]
    ids = inp[id_column].to_numpy()[rows]
    if len(values) == 0:
        return np.zeros((0, 0))
    arr = _float64(list(values))  # None for ragged rows
    if arr is None or arr.ndim != 2 or arr.shape[1] == 0:  # find the offending row, off the hot path
        _raise_irregular(values, ids, column, stage, id_column)
    finite = np.isfinite(arr).all(axis=1)
    if not finite.all():
        bad = int(np.argmin(finite))
        raise ValueError(f'{stage}: column {column!r} holds NaN or inf at {id_column}={ids[bad]!r}; '
                         'check the encoder or index that produced it')
    return arr


def _raise_irregular(values: np.ndarray, ids: np.ndarray, column: str, stage: object, id_column: str):
    for value, ident in zip(values, ids):
        if np.ndim(value) != 1 or np.size(value) == 0:
            shown = 'None' if value is None else f'{type(value).__name__} of shape {np.shape(value)}'
            raise ValueError(f'{stage}: column {column!r} at {id_column}={ident!r} holds {shown}, not a 1-D vector; '
                             'every row needs one non-empty vector from the encoder or index')
    for value, ident in zip(values, ids):
        if np.size(value) != np.size(values[0]):
            raise ValueError(f'{stage}: column {column!r} holds vectors of different sizes ({id_column}={ident!r} has '
                             f'{np.size(value)}, {id_column}={ids[0]!r} has {np.size(values[0])}); every row needs a '
                             'vector from the same encoder')
    for value, ident in zip(values, ids):
        if np.asarray(value).dtype.kind not in 'biuf':
            raise ValueError(f'{stage}: column {column!r} at {id_column}={ident!r} holds {np.asarray(value).dtype} '
                             'values, not real numbers; every row needs a float vector from the encoder or index')
    raise ValueError(f'{stage}: column {column!r} cannot be stacked into a matrix of real numbers')


def numeric_column(frame: pd.DataFrame, column: str, stage: object, fix: str) -> np.ndarray:
    """``frame[column]`` as float64 (NaN where missing); a value that is no real number is a ValueError naming
    ``stage``, the column, the row's qid and docno, and ``fix``."""
    values = frame[column].to_numpy()
    floats = _float64(values if values.dtype.kind in 'biuf' else [np.nan if v is None or v is pd.NA else v
                                                                  for v in values])
    if floats is not None:
        return floats
    for row, value in enumerate(values):  # a missing value passes; numeric text is a number
        if value is not None and value is not pd.NA and (np.ndim(value) != 0 or _float64(value) is None):
            raise ValueError(f'{stage}: column {column!r} holds {value!r} ({type(value).__name__}) at '
                             f'{_row_ids(frame, row)}, not a number; {fix}')
    raise ValueError(f'{stage}: column {column!r} cannot be read as numbers; {fix}')


def _row_ids(frame: pd.DataFrame, row: int) -> str:
    """``qid=..., docno=...`` of a row, to name it in an error."""
    return ', '.join(f'{c}={frame[c].iloc[row]!r}' for c in ('qid', 'docno') if c in frame.columns)


def _float64(values: object) -> Optional[np.ndarray]:
    """``values`` as a float64 array; None where numpy cannot read them so (complex values are not silently cut)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter('error', _COMPLEX_WARNING)
            return np.array(values, dtype=np.float64)
    except (ValueError, TypeError, _COMPLEX_WARNING):
        return None


def per_row(vectors: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """A column whose row ``i`` holds ``vectors[codes[i]]``: the rows of a query share one array."""
    return np.fromiter(vectors, dtype=object, count=len(vectors))[codes]


def check_same_dims(stage: object, dims: int, other_dims: int, column: str, where: str = '') -> None:
    """``where`` (e.g. ``" at qid='q1'"``) points at the offending row when one row is to blame."""
    if other_dims != dims:
        raise ValueError(f'{stage}: query_vec has {dims} dimensions but {column}{where} has {other_dims}; '
                         'encode queries and documents with the same model')


def query_vectors(inp: pd.DataFrame, column: str, groups: 'QueryGroups', stage: object) -> np.ndarray:
    """The query-level ``column`` as one float64 vector per query (n, p); rows of one query that disagree (two runs
    concatenated) are an error, not silently scored with the first row's vector."""
    vectors = stack_vectors(inp, column, groups.first_rows, stage, 'qid')
    values = inp[column].to_numpy()
    firsts = values[groups.first_rows][groups.codes]
    for row, (value, first) in enumerate(zip(values, firsts)):
        if value is first or _same_bytes(value, first) or np.array_equal(value, first):
            continue
        head = int(groups.first_rows[groups.codes[row]])
        raise ValueError(f'{stage}: column {column!r} differs between rows of one query ({_row_ids(inp, head)} and '
                         f'{_row_ids(inp, row)}), but a query has one {column}; give every row of a query the same '
                         'vector (or give the rows of different queries different qids)')
    return vectors


def _same_bytes(a: object, b: object) -> bool:
    """Equal arrays of one dtype and shape, by their bytes: ~10x faster than ``np.array_equal``."""
    return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
            and a.tobytes() == b.tobytes())


class QueryGroups(NamedTuple):
    """Rows of a frame grouped by qid (in order of first appearance)."""
    codes: np.ndarray  # (rows,) query index of each row
    first_rows: np.ndarray  # (n,) position of one row of each query

    @property
    def size(self) -> int:
        return len(self.first_rows)


def group_queries(inp: pd.DataFrame, stage: object) -> QueryGroups:
    """The rows of ``inp`` grouped by qid (a missing qid is an error, see :func:`check_qids`)."""
    qids = inp['qid'].to_numpy()
    check_qids(inp, stage, qids)
    change = np.ones(len(qids), dtype=bool)
    change[1:] = qids[1:] != qids[:-1]
    heads = qids[change]
    if len(set(heads.tolist())) == len(heads):  # each qid's rows together: pd.factorize's codes without hashing
        return QueryGroups(np.cumsum(change) - 1, np.flatnonzero(change))
    codes, _ = pd.factorize(qids, sort=False)
    return QueryGroups(codes, np.unique(codes, return_index=True)[1])  # the first row of each code


def check_qids(inp: pd.DataFrame, stage: object, qids: Optional[np.ndarray] = None) -> None:
    """A missing qid (NaN, None, pd.NA) is a ValueError naming ``stage`` and the row: grouping would drop the row or
    give it another query's vector."""
    missing = pd.isna(inp['qid'].to_numpy() if qids is None else qids)
    if not missing.any():
        return
    first = int(np.argmax(missing))
    detail = ', '.join(f'{c}={inp[c].iloc[first]!r}' for c in ('docno', 'query') if c in inp.columns)
    where = f'row {first}' + (f' ({detail})' if detail else '')
    raise ValueError(f'{stage}: column \'qid\' is missing (NaN/None) in {int(missing.sum())} row(s), first at {where}; '
                     'every row needs the qid of its query: fill those qids or drop the rows '
                     "(inp.dropna(subset=['qid']))")


class Feedback(NamedTuple):
    """Feedback documents of each query, padded to ``slots``: row positions in the frame and a validity mask."""
    rows: np.ndarray  # (n, slots) frame positions, -1 where padded
    mask: np.ndarray  # (n, slots) bool


def select_feedback(inp: pd.DataFrame, groups: QueryGroups, slots: int, stage: object, *, from_bottom: bool = False,
                    skip_top: int = 0) -> Feedback:
    """The ``slots`` highest-scored rows of each query (ties keep frame order), or with ``from_bottom`` the lowest
    below the ``skip_top`` highest; padded to at most the largest query. A NaN score is an error."""
    scores = numeric_column(inp, 'score', stage, 'the first stage must give numeric scores: convert the column '
                            "(inp.assign(score=pd.to_numeric(inp['score'])))")
    nan = np.isnan(scores)
    if nan.any():
        bad = int(np.argmax(nan))
        raise ValueError(f"{stage}: column 'score' is NaN at qid={inp['qid'].iloc[bad]!r}, "
                         f"docno={inp['docno'].iloc[bad]!r} ({int(nan.sum())} row(s)); feedback documents are the "
                         'highest-scored candidates of each query: fix the first stage or drop those rows')
    counts = np.bincount(groups.codes, minlength=groups.size)
    slots = int(min(slots, counts.max(initial=0)))
    step = np.diff(groups.codes)  # a retriever's output is already in (qid, -score) order: no sort
    in_order = np.all((step > 0) | ((step == 0) & (np.diff(scores) <= 0)))
    order = np.arange(len(scores)) if in_order else np.lexsort((-scores, groups.codes))
    sorted_codes = groups.codes[order]
    starts = np.searchsorted(sorted_codes, np.arange(groups.size))
    rank = np.arange(len(order)) - starts[sorted_codes]
    slot = counts[sorted_codes] - 1 - rank if from_bottom else rank
    chosen = (slot < slots) & (rank >= skip_top)
    rows = np.full((groups.size, slots), -1, dtype=np.int64)
    rows[sorted_codes[chosen], slot[chosen]] = order[chosen]
    return Feedback(rows, rows >= 0)


def gather_vectors(inp: pd.DataFrame, column: str, feedback: Feedback, dims: int, stage: object) -> np.ndarray:
    """(n, slots, p) vectors of the feedback rows; zeros where padded."""
    n, slots = feedback.rows.shape
    unpadded = n and slots and feedback.mask.all()
    out = np.zeros((n, slots, dims))
    taken = feedback.rows.ravel() if unpadded else feedback.rows[feedback.mask]
    if len(taken):
        vecs = stack_vectors(inp, column, taken, stage, 'docno')
        check_same_dims(stage, dims, vecs.shape[1], column)
        if unpadded:
            return vecs.reshape(n, slots, dims)
        out[feedback.mask] = vecs
    return out


def empty_frame(inp: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """A stage's output for an empty input: no rows, the input's columns and the new ones."""
    return pd.DataFrame({c: inp[c] if c in inp.columns else pd.Series(dtype=object) for c in columns})


def float_twin(qid: str) -> Optional[str]:
    """The other way of writing an integer qid: ``'1'`` <-> ``'1.0'`` (None for a qid that is no integer)."""
    if re.fullmatch(r'[+-]?\d+', qid):
        return f'{qid}.0'
    match = re.fullmatch(r'([+-]?\d+)\.0+', qid)
    return match.group(1) if match else None


def check_qids_written_alike(qids: Iterable[str], known: Collection[str], stage: object, source: str,
                             fix: str) -> None:
    """Raises when an input qid is not in ``known`` (the qids of ``source``) but its :func:`float_twin` is: PyTerrier
    compares qids as strings, so the query would silently match nothing."""
    for qid in qids:
        if qid in known:
            continue
        other = float_twin(qid)
        if other is not None and other in known:
            floats = 'the input' if '.' in qid else source
            raise ValueError(f'{stage}: qid {qid!r} of the input has no entry in {source}, but {source} have qid '
                             f'{other!r}: the same integer qid, written as a float in {floats} (pandas reads a column '
                             f'of integers with a gap as floats); read the qids as strings on both sides, {fix}')


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


def read_qid_tsv(path: Union[str, os.PathLike], *, what: str, allow_empty: bool, float_qids: bool = True
                 ) -> Dict[str, str]:
    """``{qid: text}`` from ``qid<TAB><what>`` lines, in file order (further tabs belong to the text). A line without
    a tab, a qid that is empty, holds whitespace or comes twice, (unless ``allow_empty``) an empty text and (unless
    ``float_qids``) an integer qid written as a float are a ValueError naming the file, the line and the fix."""
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
        if not float_qids and '.' in qid and float_twin(qid) is not None:
            raise ValueError(f'{path}:{line_no}: qid {qid!r} is an integer written as a float, which matches no query '
                             f'(qids are compared as written); write it as {float_twin(qid)!r} (a file written by '
                             "pandas: read the qids with dtype={'qid': str})")
        if not allow_empty and not text.strip():
            raise ValueError(f'{path}:{line_no}: qid {qid!r} has an empty {what}; write its text after the tab or '
                             'remove the line')
        if (earlier := first_line.setdefault(qid, line_no)) != line_no:
            raise ValueError(f'{path}:{line_no}: qid {qid!r} is also on line {earlier}; give each qid one {what}, or '
                             'remove the repeated line')
        rows[qid] = text
    return rows
