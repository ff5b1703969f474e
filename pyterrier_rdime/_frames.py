"""Pandas edges shared by the stages: stacking vector columns with clear errors, grouping rows by query."""
import warnings
from typing import NamedTuple, Sequence

import numpy as np
import pandas as pd

_COMPLEX_WARNING = getattr(getattr(np, 'exceptions', np), 'ComplexWarning')


def stack_vectors(inp: pd.DataFrame, column: str, rows: np.ndarray, stage: object, id_column: str) -> np.ndarray:
    """Stack ``inp[column]`` at positions ``rows`` into a float64 (len(rows), p) array.

    Raises a ValueError naming ``stage``, the column and the offending ``id_column`` value when vectors are not
    1-D, differ in length, or hold NaN/inf.
    """
    values = inp[column].to_numpy()[rows]
    ids = inp[id_column].to_numpy()[rows]
    if len(values) == 0:
        return np.zeros((0, 0))
    arr = _stack_regular(values)
    if arr is None:  # not a clean (rows, p) stack: find the offending row (a per-row check, off the hot path)
        sizes = np.fromiter((np.ndim(v) == 1 and np.size(v) for v in values), dtype=np.int64, count=len(values))
        if np.any(sizes == 0) or np.any(sizes != sizes[0]):
            bad = int(np.argmax((sizes == 0) | (sizes != sizes[0])))
            raise ValueError(f'{stage}: column {column!r} holds vectors of different sizes or shapes ({id_column}='
                             f'{ids[bad]!r} has {np.shape(values[bad])}, {id_column}={ids[0]!r} has '
                             f'{np.shape(values[0])}); every row needs a 1-D vector from the same encoder')
        arr = np.stack(values)
    arr = arr.astype(np.float64, copy=False)
    finite = np.isfinite(arr).all(axis=1)
    if not finite.all():
        bad = int(np.argmin(finite))
        raise ValueError(f'{stage}: column {column!r} holds NaN or inf at {id_column}={ids[bad]!r}; '
                         'check the encoder or index that produced it')
    return arr


def _stack_regular(values: np.ndarray):
    """``np.stack(values)`` as float64 when every value is a non-empty 1-D real vector of one length, else None."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter('error', _COMPLEX_WARNING)  # complex input: the slow path's cast
            arr = np.array(list(values), dtype=np.float64)  # raises on ragged rows
    except (ValueError, TypeError, _COMPLEX_WARNING):
        return None
    if arr.ndim != 2 or arr.shape[1] == 0:
        return None
    return arr


def per_row(vectors: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """A column of per-row vectors from per-query ``vectors`` (n, p): row ``i`` holds ``vectors[codes[i]]``. The rows
    of a query share one array (as pyterrier-dr's query encoder does); no per-row Python loop."""
    per_query = np.empty(len(vectors), dtype=object)
    for i, vector in enumerate(vectors):
        per_query[i] = vector
    return per_query[codes]


def check_same_dims(stage: object, dims: int, other_dims: int, column: str) -> None:
    if other_dims != dims:
        raise ValueError(f'{stage}: query_vec has {dims} dimensions but {column} has {other_dims}; '
                         'encode queries and documents with the same model')


class QueryGroups(NamedTuple):
    """Rows of a frame grouped by qid (in order of first appearance)."""
    codes: np.ndarray  # (rows,) query index of each row
    first_rows: np.ndarray  # (n,) position of one row of each query

    @property
    def size(self) -> int:
        return len(self.first_rows)


def group_queries(inp: pd.DataFrame) -> QueryGroups:
    codes = _contiguous_codes(inp['qid'].to_numpy())
    if codes is not None:  # the usual frame: each query's rows together; same codes as pd.factorize, no hashing
        return QueryGroups(codes, np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]]))
    codes, uniques = pd.factorize(inp['qid'], sort=False)
    first_rows = np.full(len(uniques), -1, dtype=np.int64)
    # reversed assignment leaves the first occurrence of each code
    first_rows[codes[::-1]] = np.arange(len(codes))[::-1]
    return QueryGroups(codes, first_rows)


def _contiguous_codes(qids: np.ndarray):
    """Query codes in order of first appearance when every qid's rows are contiguous (and none is missing), else
    None."""
    if len(qids) == 0:
        return None
    change = np.ones(len(qids), dtype=bool)
    change[1:] = qids[1:] != qids[:-1]
    heads = qids[change]
    if pd.isna(heads).any() or len(set(heads.tolist())) != len(heads):
        return None
    return np.cumsum(change) - 1


class Feedback(NamedTuple):
    """Feedback documents of each query, padded to ``slots``: row positions in the frame and a validity mask."""
    rows: np.ndarray  # (n, slots) frame positions, -1 where padded
    mask: np.ndarray  # (n, slots) bool


def select_feedback(inp: pd.DataFrame, groups: QueryGroups, slots: int, *, from_bottom: bool = False,
                    skip_top: int = 0) -> Feedback:
    """The ``slots`` highest-scored rows of each query (ties keep frame order), or with ``from_bottom`` the
    ``slots`` lowest-scored ones, never taking any of the ``skip_top`` highest."""
    scores = inp['score'].to_numpy(dtype=np.float64)
    order = _ranked_order(scores, groups.codes)
    sorted_codes = groups.codes[order]
    starts = np.searchsorted(sorted_codes, np.arange(groups.size))
    rank = np.arange(len(order)) - starts[sorted_codes]
    if from_bottom:
        counts = np.bincount(groups.codes, minlength=groups.size)
        slot = counts[sorted_codes] - 1 - rank
        chosen = (slot < slots) & (rank >= skip_top)
    else:
        slot = rank
        chosen = slot < slots
    rows = np.full((groups.size, slots), -1, dtype=np.int64)
    rows[sorted_codes[chosen], slot[chosen]] = order[chosen]
    return Feedback(rows, rows >= 0)


def _ranked_order(scores: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """``np.lexsort((-scores, codes))`` (rows by query, then descending score, ties in frame order), without the sort
    when the frame is already in that order (a retriever's output usually is)."""
    step = np.diff(codes)
    if np.all((step > 0) | ((step == 0) & (np.diff(scores) <= 0))):
        return np.arange(len(codes))
    return np.lexsort((-scores, codes))


def gather_vectors(inp: pd.DataFrame, column: str, feedback: Feedback, dims: int, stage: object) -> np.ndarray:
    """(n, slots, p) vectors of the feedback rows; zeros where padded."""
    n, slots = feedback.rows.shape
    if n and slots and feedback.mask.all():  # every query has all its slots: no padding to fill
        vecs = stack_vectors(inp, column, feedback.rows.ravel(), stage, 'docno')
        check_same_dims(stage, dims, vecs.shape[1], column)
        return vecs.reshape(n, slots, dims)
    out = np.zeros((n, slots, dims))
    taken = feedback.rows[feedback.mask]
    if len(taken):
        vecs = stack_vectors(inp, column, taken, stage, 'docno')
        check_same_dims(stage, dims, vecs.shape[1], column)
        out[feedback.mask] = vecs
    return out


def query_columns(columns: Sequence[str]) -> list:
    """PyTerrier's query-level columns: every column whose name starts with 'q'."""
    return [c for c in columns if c.startswith('q')]


def empty_frame(inp: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """The output of a stage for an empty input: no rows, the input's columns kept, new ones added."""
    return pd.DataFrame({c: inp[c] if c in inp.columns else pd.Series(dtype=object) for c in columns})
