"""Pandas edges shared by the stages: stacking vector columns with clear errors, grouping rows by query."""
from typing import NamedTuple, Sequence

import numpy as np
import pandas as pd


def stack_vectors(inp: pd.DataFrame, column: str, rows: np.ndarray, stage: object, id_column: str) -> np.ndarray:
    """Stack ``inp[column]`` at positions ``rows`` into a float64 (len(rows), p) array.

    Raises a ValueError naming ``stage``, the column and the offending ``id_column`` value when vectors are not
    1-D, differ in length, or hold NaN/inf.
    """
    values = inp[column].to_numpy()[rows]
    ids = inp[id_column].to_numpy()[rows]
    if len(values) == 0:
        return np.zeros((0, 0))
    sizes = np.fromiter((np.ndim(v) == 1 and np.size(v) for v in values), dtype=np.int64, count=len(values))
    if np.any(sizes == 0) or np.any(sizes != sizes[0]):
        bad = int(np.argmax((sizes == 0) | (sizes != sizes[0])))
        raise ValueError(f'{stage}: column {column!r} holds vectors of different sizes or shapes ({id_column}='
                         f'{ids[bad]!r} has {np.shape(values[bad])}, {id_column}={ids[0]!r} has '
                         f'{np.shape(values[0])}); every row needs a 1-D vector from the same encoder')
    arr = np.stack(values).astype(np.float64, copy=False)
    finite = np.isfinite(arr).all(axis=1)
    if not finite.all():
        bad = int(np.argmin(finite))
        raise ValueError(f'{stage}: column {column!r} holds NaN or inf at {id_column}={ids[bad]!r}; '
                         'check the encoder or index that produced it')
    return arr


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
    codes, uniques = pd.factorize(inp['qid'], sort=False)
    first_rows = np.full(len(uniques), -1, dtype=np.int64)
    # reversed assignment leaves the first occurrence of each code
    first_rows[codes[::-1]] = np.arange(len(codes))[::-1]
    return QueryGroups(codes, first_rows)


class Feedback(NamedTuple):
    """Feedback documents of each query, padded to ``slots``: row positions in the frame and a validity mask."""
    rows: np.ndarray  # (n, slots) frame positions, -1 where padded
    mask: np.ndarray  # (n, slots) bool


def select_feedback(inp: pd.DataFrame, groups: QueryGroups, slots: int, *, from_bottom: bool = False,
                    skip_top: int = 0) -> Feedback:
    """The ``slots`` highest-scored rows of each query (ties keep frame order), or with ``from_bottom`` the
    ``slots`` lowest-scored ones, never taking any of the ``skip_top`` highest."""
    scores = inp['score'].to_numpy(dtype=np.float64)
    order = np.lexsort((-scores, groups.codes))
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


def gather_vectors(inp: pd.DataFrame, column: str, feedback: Feedback, dims: int, stage: object) -> np.ndarray:
    """(n, slots, p) vectors of the feedback rows; zeros where padded."""
    n, slots = feedback.rows.shape
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
