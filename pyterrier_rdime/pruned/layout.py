"""The two copies of an index that :class:`PrunedRetriever` reads, both dimension-major ``(dims, docs)``: the float32
matrix, and its int8 codes for the compressed path (``code[j, d] = round(value[j, d] / scale[j])`` with ``scale[j] =
max_d |value[j, d]| / 127``, and each dimension's measured largest quantisation error). A FlexIndex's copies are
``rdime.dim_major.npy`` and ``rdime.dim_major.i8.npy`` on disk, memory-mapped and shared by every process, streamed
from ``vecs.f4`` once in blocks and kept by the protocol of :mod:`pyterrier_rdime.store`; an array index's are in
memory.
"""
import dataclasses
import os
import threading
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd
import pyterrier as pt

from .. import store
from ..store import check_finite, check_whole, flex_layout_path, portable_index, random_rows, row_reader

#: Docnos hashed at a time when looking for a repeated one (their text is held only a block at a time).
DOCNO_BLOCK = 2 ** 20
#: Documents per block when building: ``2 x block x dims x 4`` bytes of memory (200 MiB for 768 dimensions).
BUILD_BLOCK = 32768
#: The largest code: int8 values are in ``[-CODE_MAX, CODE_MAX]`` (-128 unused, so that the scale is symmetric).
CODE_MAX = 127
#: Dimensions quantised per step of an in-memory copy (``ROWS_PER_STEP x docs x 8`` bytes of temporary memory).
ROWS_PER_STEP = 8


@dataclasses.dataclass(frozen=True)
class Codes:
    """An int8 copy of a dimension-major matrix: ``codes`` ``(dims, docs)`` int8 C-contiguous, with ``scale``
    (float32) and the largest quantisation ``error`` (float64) of each dimension."""
    codes: np.ndarray
    scale: np.ndarray
    error: np.ndarray


class Layout:
    """The dimension-major matrix, its int8 copy and the docnos of one index, opened (or built) on first use;
    thread-safe. A FlexIndex's files are checked by ``stat`` on every call. Pickles without the copies.

    Args:
        index: a pyterrier-dr ``FlexIndex`` or a ``(docs, dims)`` array.
        docnos: with an array index, the docno of each row (default: the row number as a string).
        stage: the name used in error messages.
        verbose: show a progress bar while a layout is built.
    """

    def __init__(self, index: object, *, docnos: Optional[Sequence[str]] = None, stage: str = 'PrunedRetriever',
                 verbose: bool = False):
        self.index = index
        self.docnos = docnos
        self.stage = stage
        self.verbose = verbose
        self._lock = threading.Lock()
        self._in_memory: Optional[Tuple[np.ndarray, np.ndarray]] = None  # an array index's matrix and abs_max
        self._codes: Optional[Codes] = None  # an array index's int8 copy
        self._docno_array: Optional[np.ndarray] = None
        self._whole = False  # a FlexIndex found whole
        self._row_file: Optional[Tuple[tuple, np.memmap]] = None  # and the identity of its vecs.f4

    def __getstate__(self) -> dict:
        return dict(index=portable_index(self.index), docnos=self.docnos, stage=self.stage, verbose=self.verbose)

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    @property
    def is_array(self) -> bool:
        return isinstance(self.index, np.ndarray)

    @property
    def shape(self) -> Tuple[int, int]:
        """``(dims, docs)`` of the index, read from its metadata (no copy is opened or built)."""
        if self.is_array:
            return self.index.shape[1], self.index.shape[0]
        self._check_whole()
        return flex_shape(self.index)

    def _check_whole(self) -> None:
        if not self._whole:
            check_whole(self.index, self.stage)
            self._whole = True

    def matrix(self) -> np.ndarray:
        """The ``(dims, docs)`` float32 C-contiguous matrix (built on first use)."""
        if self.is_array:
            return self._array_copy()[0]
        return open_flex_layout(self.index, stage=self.stage, verbose=self.verbose)

    def codes(self) -> Codes:
        """The int8 copy (built on first use)."""
        if not self.is_array:
            return open_flex_compressed(self)
        matrix = self.matrix()
        with self._lock:
            if self._codes is None:
                self._codes = quantise(matrix)
        return self._codes

    def has_matrix(self) -> bool:
        """Whether the float32 matrix is at hand without a build (``stat`` only)."""
        return self.is_array or open_flex_layout(self.index, stage=self.stage, build=False) is not None

    def abs_max(self) -> np.ndarray:
        """The largest absolute value of each dimension, float64 ``(dims,)`` (a FlexIndex's from its cached stats)."""
        if self.is_array:
            return self._array_copy()[1]
        abs_max = store.vector_stats(self.index, stage=self.stage, verbose=self.verbose)['abs_max']
        check_flex_docnos(self.index, self.stage)
        return abs_max

    def _array_copy(self) -> Tuple[np.ndarray, np.ndarray]:
        with self._lock:
            if self._in_memory is None:
                if self.docnos is not None:
                    check_unique_docnos(self.lookup_docnos, len(self.docnos), stage=self.stage,
                                        source='the array index', fix='give each row its own docno')
                self._in_memory = dimension_major(self.index, docnos=self.docnos, stage=self.stage)
            return self._in_memory

    def doc_rows(self) -> Optional[np.ndarray]:
        """The index's ``(docs, dims)`` float32 C-contiguous vectors where it holds such, else None."""
        if self.is_array:
            return self.index if self.index.dtype == np.float32 and self.index.flags.c_contiguous else None
        self._check_whole()
        return self.index.payload(return_docnos=False)[0]

    def rescoring_rows(self) -> Optional[object]:
        """What the compressed path re-scores from by ``rows[docids]`` (None: the dimension-major matrix)."""
        if self.is_array:
            return self.doc_rows()
        now = store.snapshot([Path(self.index.index_path) / 'vecs.f4'])
        if self._row_file is None or self._row_file[0] != now:
            self._row_file = (now, random_rows(self.doc_rows()))
        return self._row_file[1]

    def lookup_docnos(self, docids: np.ndarray) -> np.ndarray:
        """The docnos of these docids, as an object array."""
        if not self.is_array:
            # each distinct docid once: npids decodes every key it is given (~1.4 us each at 8.8M) and the rows of a
            # batch share most of their results (360,000 results over 50,000 documents: 0.50 s -> 0.12 s)
            distinct, inverse = np.unique(docids, return_inverse=True)
            if not len(distinct):  # npids cannot look up no keys
                return np.empty(0, dtype=object)
            docnos = self.index.payload(return_dvecs=False)[0]
            return np.asarray(docnos.fwd[distinct], dtype=object)[inverse]
        if self.docnos is None:
            return docids.astype(str).astype(object)
        if self._docno_array is None:
            self._docno_array = np.asarray(self.docnos, dtype=object)
        return self._docno_array[docids]


def flex_shape(index: object) -> Tuple[int, int]:
    """``(dims, docs)`` of a FlexIndex, from its ``pt_meta.json``."""
    meta = index.payload(return_dvecs=False, return_docnos=False)[0]
    return int(meta['vec_size']), int(meta['doc_count'])


def check_flex_docnos(index: object, stage: str) -> None:
    """Refuses a FlexIndex where two documents share a docno, checked once per ``docnos.npids`` (a record keeps it)."""
    def check(path: Path) -> dict:
        docnos = index.payload(return_dvecs=False)[0]
        check_unique_docnos(docnos.fwd.__getitem__, len(docnos), stage=stage, source=str(index.index_path),
                            fix='index each document once (drop the repeats from the documents) and rebuild the '
                                "index with indexer(mode='overwrite')")
        return {}
    store.derived(flex_layout_path(index).with_suffix('.docnos.json'), 'docno-check', folder=Path(index.index_path),
                  sources=('docnos.npids',), data=False, build=check, before_build=lambda: check_whole(index, stage),
                  what='the docno check', stage=stage)


def dimension_major(vecs: np.ndarray, *, docnos: Optional[Sequence[str]] = None,
                    stage: str = 'PrunedRetriever') -> Tuple[np.ndarray, np.ndarray]:
    """An in-memory ``(dims, docs)`` float32 copy of ``(docs, dims)`` vectors and each dimension's abs max; fails on
    NaN or inf."""
    docs, dims = vecs.shape
    view = vecs.dtype == np.float32 and vecs.flags.f_contiguous
    out = vecs.T if view else np.empty((dims, docs), dtype=np.float32)
    abs_max = np.zeros(dims)
    for start in range(0, docs, BUILD_BLOCK):
        rows = np.asarray(vecs[start:start + BUILD_BLOCK], dtype=np.float32)
        check_finite(rows, start, docnos, stage, 'the array index')
        np.maximum(abs_max, np.abs(rows).max(axis=0), out=abs_max)
        if not view:
            out[:, start:start + len(rows)] = rows.T
    return out, abs_max


def open_flex_layout(index: object, *, stage: str = 'PrunedRetriever', verbose: bool = False,
                     build: bool = True) -> Optional[np.ndarray]:
    """A FlexIndex's read-only memory-mapped layout, (re)built first where stale (unless ``build`` is False: None
    then); concurrent builders wait for the first."""
    def write(path: Path) -> dict:
        check_flex_docnos(index, stage)
        docnos, vecs, _ = index.payload()
        build_layout(vecs, path, docnos=docnos.fwd, stage=stage, source=str(index.index_path), verbose=verbose)
        return {}
    return _open_copy(index, flex_layout_path(index), 'layout', np.dtype('<f4'), {}, lambda matrix: matrix,
                      write if build else None, what='the dimension-major layout', stage=stage,
                      cause='(a build was interrupted, or the index changed)')


def open_flex_compressed(layout: Layout) -> Codes:
    """The memory-mapped int8 copy of a FlexIndex, (re)built first from its vectors where stale."""
    index, stage = layout.index, layout.stage

    def write(path: Path) -> dict:
        abs_max = layout.abs_max()  # the vectors' statistics; docnos checked for repeats
        docnos, vecs, _ = index.payload()
        scale, error = build_compressed(vecs, path, abs_max, docnos=docnos.fwd, stage=stage,
                                        source=str(index.index_path), verbose=layout.verbose)
        return {'scale': scale.tolist(), 'error': error.tolist()}
    return _open_copy(index, compressed_path(flex_layout_path(index)), 'int8-copy', np.dtype('i1'),
                      {'scale': np.float32, 'error': np.float64}, Codes, write, what='the compressed copy',
                      stage=stage, cause='(damaged, or a build was interrupted)')


def _open_copy(index: object, path: Path, kind: str, dtype: np.dtype, arrays: Dict[str, type], opened: Callable,
               build: Optional[Callable[[Path], dict]], *, what: str, stage: str, cause: str) -> object:
    """``opened(matrix, *arrays)``: a FlexIndex's memory-mapped ``(dims, docs)`` copy of ``dtype`` at ``path`` and
    the per-dimension ``arrays`` of its record, kept by :func:`.store.derived` (a wrong shape rebuilds it)."""
    def check(path: Path, content: dict) -> Optional[str]:
        dims, docs = flex_shape(index)
        problem = npy_problem(path, (dims, docs), dtype)
        return None if problem is None and all(len(content[name]) == dims for name in arrays) else \
            f'{problem or "its record is of another shape"} {cause}'
    return store.derived(path, kind, folder=Path(index.index_path), sources=store.SOURCES, check=check, build=build,
                         before_build=lambda: check_whole(index, stage),
                         open_with=lambda path, content: opened(np.load(path, mmap_mode='r'), *(
                             np.asarray(content[name], dtype=array_dtype) for name, array_dtype in arrays.items())),
                         what=what, stage=stage)


def build_layout(vecs: np.ndarray, path: Path, *, docnos: Optional[object] = None, stage: str = 'PrunedRetriever',
                 source: str = 'the index', verbose: bool = False) -> None:
    """Write the ``(dims, docs)`` float32 ``.npy`` layout of ``(docs, dims)`` vectors to ``path`` atomically,
    ``BUILD_BLOCK`` documents at a time. Raises ValueError naming a document with NaN or inf."""
    _write_dim_major(vecs, path, np.dtype('<f4'), lambda rows: rows, docnos=docnos, stage=stage, source=source,
                     desc='layout', verbose=verbose)


def build_compressed(vecs: np.ndarray, path: Path, abs_max: np.ndarray, *, docnos: Optional[object] = None,
                     stage: str = 'PrunedRetriever', source: str = 'the index',
                     verbose: bool = False) -> Tuple[np.ndarray, np.ndarray]:
    """Write the int8 ``(dims, docs)`` ``.npy`` copy of ``(docs, dims)`` vectors to ``path`` atomically,
    ``BUILD_BLOCK`` documents at a time, the codes equal to :func:`quantise`'s. Returns ``(scale, error)``; fails on
    NaN or inf."""
    scale = scales(abs_max)
    error = np.zeros(vecs.shape[1])

    def encode(rows: np.ndarray) -> np.ndarray:
        codes, wide = _quantised(rows, scale)
        np.maximum(error, wide.max(axis=0, initial=0), out=error)
        return codes
    _write_dim_major(vecs, path, np.dtype('i1'), encode, docnos=docnos, stage=stage, source=source, desc='int8 copy',
                     verbose=verbose)
    return scale, error


def _write_dim_major(vecs: np.ndarray, path: Path, dtype: np.dtype, encode: Callable[[np.ndarray], np.ndarray], *,
                     docnos: Optional[object], stage: str, source: str, desc: str, verbose: bool) -> None:
    """Write ``encode(rows)`` of each block of checked ``(docs, dims)`` rows as a ``(dims, docs)`` ``.npy`` of
    ``dtype`` to ``path`` atomically, each dimension's part at its place (no copy of the matrix in memory)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    docs, dims = vecs.shape
    with store.atomic_open(path, 'wb') as out:
        np.lib.format.write_array_header_1_0(out, {'descr': dtype.str, 'fortran_order': False, 'shape': (dims, docs)})
        header = out.tell()
        out.truncate(header + dims * docs * dtype.itemsize)
        out.flush()
        with row_reader(vecs) as read_rows, pt.tqdm(total=docs, desc=f'{stage} {desc}', unit='doc',
                                                    disable=not verbose or not docs) as progress:
            for start in range(0, docs, BUILD_BLOCK):
                rows = read_rows(start, min(docs, start + BUILD_BLOCK))
                check_finite(rows, start, docnos, stage, source)
                columns = np.ascontiguousarray(encode(rows).T)
                for dim in range(dims):
                    os.pwrite(out.fileno(), columns[dim], header + (dim * docs + start) * dtype.itemsize)
                progress.update(len(rows))
        os.fsync(out.fileno())


def check_unique_docnos(lookup: Callable[[np.ndarray], np.ndarray], count: int, *, stage: str, source: str,
                        fix: str) -> None:
    """Raise a ValueError naming a docno that two of the ``count`` documents share, by :func:`docno_hashes` (~24
    bytes per document)."""
    hashes = docno_hashes(lookup, count)
    candidates = np.flatnonzero(np.isin(hashes, shared_hashes([hashes])))
    if not len(candidates):
        return
    docnos = pd.Series(np.asarray(lookup(candidates), dtype=object), index=candidates)
    repeated = docnos[docnos.duplicated(keep=False)]
    if len(repeated):  # else only a hash collision
        docno = repeated.iloc[0]
        docids = repeated.index[repeated == docno][:2].tolist()
        raise ValueError(f'{stage}: docno {docno!r} names more than one document of {source} (docids {docids[0]} '
                         f'and {docids[1]}), so a ranking could hold it twice; {fix}')


def docno_hashes(lookup: Callable[[np.ndarray], np.ndarray], count: int) -> np.ndarray:
    """The 64-bit hash of each of ``count`` documents' docnos (``lookup(docids)``), in docid order, a block at a
    time."""
    hashes = np.empty(count, dtype=np.uint64)
    for start in range(0, count, DOCNO_BLOCK):
        stop = min(count, start + DOCNO_BLOCK)
        hashes[start:stop] = pd.util.hash_array(np.asarray(lookup(np.arange(start, stop)), dtype=object),
                                                categorize=False)
    return hashes


def shared_hashes(per_part: List[np.ndarray]) -> np.ndarray:
    """The values that occur more than once in these hash arrays together, sorted."""
    merged = np.sort(np.concatenate(per_part), kind='stable')
    return np.unique(merged[1:][merged[1:] == merged[:-1]])


def npy_problem(path: Path, shape: Tuple[int, int], dtype: np.dtype) -> Optional[str]:
    """None for a complete C-ordered ``.npy`` matrix of this shape and dtype at ``path``; else why not."""
    if not path.exists():
        return 'there is none'
    try:
        matrix = np.load(path, mmap_mode='r')
    except (OSError, EOFError):
        return 'it is not a readable .npy file'
    except ValueError:  # not a .npy matrix, or shorter than its header says
        matrix = None
    if matrix is None or (matrix.shape, matrix.dtype, matrix.offset + matrix.nbytes, matrix.flags.c_contiguous) != (
            tuple(shape), dtype, path.stat().st_size, True):
        return f'it is incomplete or not a {dtype.name} {tuple(shape)} matrix'
    return None


def scales(abs_max: np.ndarray) -> np.ndarray:
    """Each dimension's float32 scale from its abs max; a dimension of zeros gets scale 1."""
    scale = (np.asarray(abs_max, dtype=np.float32) / CODE_MAX).astype(np.float32)
    scale[scale == 0] = 1
    return scale


def _quantised(values: np.ndarray, scale: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """The int8 codes of float32 ``values`` by ``scale`` (broadcast), and each value's quantisation error in float64
    (it enters the exact bound, so it must not be rounded down)."""
    codes = np.clip(np.rint(values / scale), -CODE_MAX, CODE_MAX).astype(np.int8)
    return codes, np.abs(values.astype(np.float64) - scale.astype(np.float64) * codes)


def quantise_rows(rows: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(codes, scale, error)`` of float32 rows ``(n, docs)``, one scale per row (:func:`scales`)."""
    rows = np.asarray(rows, dtype=np.float32)
    scale = scales(np.abs(rows).max(axis=1, initial=0))
    codes, error = _quantised(rows, scale[:, None])
    return codes, scale, error.max(axis=1, initial=0)


def quantise(dim_major: np.ndarray) -> Codes:
    """The in-memory int8 copy of a ``(dims, docs)`` float32 matrix, ``ROWS_PER_STEP`` dimensions at a time."""
    dims, docs = dim_major.shape
    codes = np.empty((dims, docs), dtype=np.int8)
    scale, error = np.empty(dims, dtype=np.float32), np.empty(dims)
    for j in range(0, dims, ROWS_PER_STEP):
        codes[j:j + ROWS_PER_STEP], scale[j:j + ROWS_PER_STEP], error[j:j + ROWS_PER_STEP] = \
            quantise_rows(dim_major[j:j + ROWS_PER_STEP])
    return Codes(codes, scale, error)


def compressed_path(layout_path: Path) -> Path:
    """Where the int8 copy of the float32 layout ``layout_path`` is stored: beside it, ``.i8`` added."""
    layout_path = Path(layout_path)
    return layout_path.with_name(f'{layout_path.stem}.i8{layout_path.suffix}')
