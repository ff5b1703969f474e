"""The int8 codes of the compressed path: ``code[j, d] = round(value[j, d] / scale[j])`` with ``scale[j] = max_d
|value[j, d]| / 127``, and each dimension's measured largest quantisation error. A FlexIndex's copy is
``rdime.dim_major.i8.npy``, streamed from ``vecs.f4`` and kept by :mod:`pyterrier_rdime.store`; an array index's is
in memory.
"""
import dataclasses
import os
import threading
from pathlib import Path
from typing import Optional, Tuple

import numpy as np
import pyterrier as pt

from .. import store
from .._index_files import SOURCES, check_finite, flex_layout_path, row_reader
from ..flex_index import check_whole
from .layout import BUILD_BLOCK, Layout, npy_problem

#: The largest code: int8 values are in ``[-CODE_MAX, CODE_MAX]`` (-128 unused, so that the scale is symmetric).
CODE_MAX = 127
#: Dimensions quantised per step of a build (``ROWS_PER_STEP x docs x 8`` bytes of temporary memory).
ROWS_PER_STEP = 8


@dataclasses.dataclass(frozen=True)
class Codes:
    """An int8 copy of a dimension-major matrix: ``codes`` ``(dims, docs)`` int8 C-contiguous, with ``scale``
    (float32) and the largest quantisation ``error`` (float64) of each dimension."""
    codes: np.ndarray
    scale: np.ndarray
    error: np.ndarray


def quantise_rows(rows: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(codes, scale, error)`` of float32 rows ``(n, docs)``, one scale per row; a row of zeros gets scale 1."""
    rows = np.asarray(rows, dtype=np.float32)
    scale = (np.abs(rows).max(axis=1, initial=0) / CODE_MAX).astype(np.float32)
    scale[scale == 0] = 1
    codes = np.clip(np.rint(rows / scale[:, None]), -CODE_MAX, CODE_MAX).astype(np.int8)
    error = np.abs(rows.astype(np.float64) - scale.astype(np.float64)[:, None] * codes).max(axis=1, initial=0)
    return codes, scale, error


def quantise(dim_major: np.ndarray) -> Codes:
    """The in-memory int8 copy of a ``(dims, docs)`` float32 matrix, ``ROWS_PER_STEP`` dimensions at a time."""
    dims, docs = dim_major.shape
    codes = np.empty((dims, docs), dtype=np.int8)
    scale, error = np.empty(dims, dtype=np.float32), np.empty(dims)
    for j in range(0, dims, ROWS_PER_STEP):
        codes[j:j + ROWS_PER_STEP], scale[j:j + ROWS_PER_STEP], error[j:j + ROWS_PER_STEP] = \
            quantise_rows(dim_major[j:j + ROWS_PER_STEP])
    return Codes(codes, scale, error)


class CompressedCopy:
    """The int8 copy of one :class:`.layout.Layout`'s index, opened (or built) on first use. Thread-safe; pickles
    without the copy."""

    def __init__(self, layout: Layout):
        self.layout = layout
        self._lock = threading.Lock()
        self._codes: Optional[Codes] = None

    def __getstate__(self) -> dict:
        return {'layout': self.layout}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state['layout'])

    def codes(self) -> Codes:
        if not self.layout.is_array:
            return open_flex_compressed(self.layout)
        with self._lock:
            if self._codes is None:
                self._codes = quantise(self.layout.matrix())
        return self._codes


def compressed_path(layout_path: Path) -> Path:
    """Where the int8 copy of the float32 layout ``layout_path`` is stored: beside it, ``.i8`` added."""
    layout_path = Path(layout_path)
    return layout_path.with_name(f'{layout_path.stem}.i8{layout_path.suffix}')


def open_flex_compressed(layout: Layout) -> Codes:
    """The memory-mapped int8 copy of a FlexIndex, (re)built first from its vectors where stale."""
    index, stage = layout.index, layout.stage
    folder = Path(index.index_path)

    def write(path: Path) -> dict:
        abs_max = layout.abs_max()  # the vectors' statistics; docnos checked for repeats
        docnos, vecs, _ = index.payload()
        scale, error = build_compressed(vecs, path, abs_max, docnos=docnos.fwd, stage=stage, source=str(folder),
                                        verbose=layout.verbose)
        return {'scale': scale.tolist(), 'error': error.tolist()}

    def check(path: Path, content: dict) -> Optional[str]:
        dims, docs = layout.shape
        problem = npy_problem(path, (dims, docs), np.dtype('i1'))
        return None if problem is None and len(content['scale']) == len(content['error']) == dims else \
            f'{problem or "its record is of another shape"} (damaged, or a build was interrupted)'
    return store.derived(compressed_path(flex_layout_path(index)), 'int8-copy', folder=folder, sources=SOURCES,
                         build=write, check=check, before_build=lambda: check_whole(index, stage),
                         open_with=lambda path, content: Codes(np.load(path, mmap_mode='r'),
                                                               np.asarray(content['scale'], dtype=np.float32),
                                                               np.asarray(content['error'], dtype=np.float64)),
                         what='the compressed copy', stage=stage)


def scales(abs_max: np.ndarray) -> np.ndarray:
    """Each dimension's float32 scale from its abs max, as :func:`quantise_rows` computes it."""
    scale = (np.asarray(abs_max, dtype=np.float32) / CODE_MAX).astype(np.float32)
    scale[scale == 0] = 1
    return scale


def build_compressed(vecs: np.ndarray, path: Path, abs_max: np.ndarray, *, docnos: Optional[object] = None,
                     stage: str = 'PrunedRetriever', source: str = 'the index', block: Optional[int] = None,
                     verbose: bool = False) -> Tuple[np.ndarray, np.ndarray]:
    """Write the int8 ``(dims, docs)`` ``.npy`` copy of ``(docs, dims)`` vectors to ``path`` atomically, ``block``
    documents at a time, the codes equal to :func:`quantise`'s. Returns ``(scale, error)``; fails on NaN or inf."""
    docs, dims = vecs.shape
    block = block or BUILD_BLOCK
    scale = scales(abs_max)
    error = np.zeros(dims)
    path.parent.mkdir(parents=True, exist_ok=True)
    with store.atomic_open(path, 'wb') as out:
        np.lib.format.write_array_header_1_0(out, {'descr': '|i1', 'fortran_order': False, 'shape': (dims, docs)})
        header = out.tell()
        out.truncate(header + dims * docs)
        out.flush()
        with row_reader(vecs) as read_rows, pt.tqdm(total=docs, desc=f'{stage} int8 copy', unit='doc',
                                                    disable=not verbose or not docs) as progress:
            for start in range(0, docs, block):
                rows = read_rows(start, min(docs, start + block))
                check_finite(rows, start, docnos, stage, source)
                codes = np.clip(np.rint(rows / scale), -CODE_MAX, CODE_MAX).astype(np.int8)
                # in float64, as quantise_rows: the error enters the exact bound, so it must not be rounded down
                wide = np.abs(rows.astype(np.float64) - scale.astype(np.float64) * codes)
                np.maximum(error, wide.max(axis=0, initial=0), out=error)
                columns = np.ascontiguousarray(codes.T)
                for dim in range(dims):
                    os.pwrite(out.fileno(), columns[dim], header + dim * docs + start)
                progress.update(len(rows))
        os.fsync(out.fileno())
    return scale, error
