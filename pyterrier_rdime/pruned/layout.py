"""The dimension-major ``(dims, docs)`` float32 copy of an index that :class:`PrunedRetriever` reads: for a FlexIndex
``rdime.dim_major.npy`` on disk, memory-mapped and shared by every process, built once in blocks and kept by the
protocol of :mod:`pyterrier_rdime.store`; for an array index, an in-memory copy.
"""
import os
import threading
from pathlib import Path
from typing import Callable, Optional, Sequence, Tuple

import numpy as np
import pandas as pd
import pyterrier as pt

from .. import store
from .._index_files import SOURCES, RowFile, check_finite, flex_layout_path, portable_index, row_reader, vector_stats
from ..flex_index import check_whole

#: Docnos hashed at a time when looking for a repeated one (their text is held only a block at a time).
DOCNO_BLOCK = 2 ** 20
#: Documents per block when building: ``2 x block x dims x 4`` bytes of memory (200 MiB for 768 dimensions).
BUILD_BLOCK = 32768


class Layout:
    """The dimension-major matrix and the docnos of one index, opened (or built) on first use; thread-safe. A
    FlexIndex's files are checked by ``stat`` on every call. Pickles without the matrix.

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
        self._docno_array: Optional[np.ndarray] = None
        self._whole = False  # a FlexIndex found whole
        self._row_file: Optional[Tuple[tuple, RowFile]] = None  # and the identity of its vecs.f4

    def __getstate__(self) -> dict:
        return {**self.__dict__, 'index': portable_index(self.index), '_lock': None, '_in_memory': None,
                '_docno_array': None, '_whole': False, '_row_file': None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _lock=threading.Lock())

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
        return open_flex_layout(self.index, stage=self.stage, verbose=self.verbose)[0]

    def has_matrix(self) -> bool:
        """Whether the float32 matrix is at hand without a build (``stat`` only)."""
        return self.is_array or open_flex_layout(self.index, stage=self.stage, build=False) is not None

    def abs_max(self) -> np.ndarray:
        """The largest absolute value of each dimension, float64 ``(dims,)`` (a FlexIndex's from its cached stats)."""
        if self.is_array:
            return self._array_copy()[1]
        abs_max = vector_stats(self.index, stage=self.stage, verbose=self.verbose)['abs_max']
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
            index = self.index
            return index if index.dtype == np.float32 and index.flags.c_contiguous else None
        self._check_whole()
        return self.index.payload(return_docnos=False)[0]

    def rescoring_rows(self) -> Optional[object]:
        """What the compressed path re-scores from by ``rows[docids]`` (None: the dimension-major matrix)."""
        if self.is_array:
            return self.doc_rows()
        now = store.snapshot([Path(self.index.index_path) / 'vecs.f4'])
        if self._row_file is None or self._row_file[0] != now:
            self._row_file = (now, RowFile(self.doc_rows()))
        return self._row_file[1]

    def lookup_docnos(self, docids: np.ndarray) -> np.ndarray:
        """The docnos of these docids, as an object array."""
        if not self.is_array:
            docnos = self.index.payload(return_dvecs=False)[0]
            return np.asarray(docnos.fwd[docids], dtype=object)
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


def dimension_major(vecs: np.ndarray, *, docnos: Optional[Sequence[str]] = None, stage: str = 'PrunedRetriever',
                    block: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray]:
    """An in-memory ``(dims, docs)`` float32 copy of ``(docs, dims)`` vectors and each dimension's abs max; fails on
    NaN or inf."""
    docs, dims = vecs.shape
    block = block or BUILD_BLOCK
    view = vecs.dtype == np.float32 and vecs.flags.f_contiguous
    out = vecs.T if view else np.empty((dims, docs), dtype=np.float32)
    abs_max = np.zeros(dims)
    for start in range(0, docs, block):
        rows = np.asarray(vecs[start:start + block], dtype=np.float32)
        check_finite(rows, start, docnos, stage, 'the array index')
        np.maximum(abs_max, np.abs(rows).max(axis=0), out=abs_max)
        if not view:
            out[:, start:start + len(rows)] = rows.T
    return out, abs_max


def open_flex_layout(index: object, *, stage: str = 'PrunedRetriever', verbose: bool = False,
                     build: bool = True) -> Optional[Tuple[np.ndarray, np.ndarray]]:
    """A FlexIndex's read-only memory-mapped layout and each dimension's abs max, (re)built first where stale
    (unless ``build`` is False: None then); concurrent builders wait for the first."""
    folder = Path(index.index_path)

    def write(path: Path) -> dict:
        check_flex_docnos(index, stage)
        docnos, vecs, _ = index.payload()
        abs_max = build_layout(vecs, path, docnos=docnos.fwd, stage=stage, source=str(folder), verbose=verbose)
        return {'abs_max': abs_max.tolist()}

    def check(path: Path, content: dict) -> Optional[str]:
        problem = npy_problem(path, flex_shape(index), np.dtype('<f4'))
        return None if problem is None and len(content['abs_max']) == flex_shape(index)[0] else \
            f'{problem or "its record is of another shape"} (a build was interrupted, or the index changed)'
    return store.derived(flex_layout_path(index), 'layout', folder=folder, sources=SOURCES, check=check,
                         build=write if build else None, before_build=lambda: check_whole(index, stage),
                         open_with=lambda path, content: (np.load(path, mmap_mode='r'),
                                                          np.asarray(content['abs_max'], dtype=np.float64)),
                         what='the dimension-major layout', stage=stage)


def build_layout(vecs: np.ndarray, path: Path, *, docnos: Optional[object] = None, stage: str = 'PrunedRetriever',
                 source: str = 'the index', block: Optional[int] = None, verbose: bool = False) -> np.ndarray:
    """Write the ``(dims, docs)`` float32 ``.npy`` layout of ``(docs, dims)`` vectors to ``path`` atomically, ``block``
    documents at a time; returns each dimension's abs max. Raises ValueError naming a document with NaN or inf."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    docs, dims = vecs.shape
    block = block or BUILD_BLOCK
    abs_max = np.zeros(dims)
    with store.atomic_open(path, 'wb') as out:
        np.lib.format.write_array_header_1_0(out, {'descr': '<f4', 'fortran_order': False, 'shape': (dims, docs)})
        header = out.tell()
        out.truncate(header + dims * docs * 4)
        out.flush()
        progress = pt.tqdm(total=docs, desc=f'{stage} layout', unit='doc') if verbose and docs else None
        with row_reader(vecs) as read_rows:
            for start in range(0, docs, block):
                rows = read_rows(start, min(docs, start + block))
                check_finite(rows, start, docnos, stage, source)
                np.maximum(abs_max, np.abs(rows).max(axis=0), out=abs_max)
                columns = np.ascontiguousarray(rows.T)
                for dim in range(dims):
                    os.pwrite(out.fileno(), columns[dim], header + (dim * docs + start) * 4)
                if progress is not None:
                    progress.update(len(rows))
        if progress is not None:
            progress.close()
        os.fsync(out.fileno())
    return abs_max


def check_unique_docnos(lookup: Callable[[np.ndarray], np.ndarray], count: int, *, stage: str, source: str,
                        fix: str) -> None:
    """Raise a ValueError naming a docno that two of the ``count`` documents share, hashing them a block at a time
    (~24 bytes per document)."""
    hashes = np.empty(count, dtype=np.uint64)
    for start in range(0, count, DOCNO_BLOCK):
        stop = min(count, start + DOCNO_BLOCK)
        docnos = np.asarray(lookup(np.arange(start, stop)), dtype=object)
        hashes[start:stop] = pd.util.hash_array(docnos, categorize=False)
    order = np.argsort(hashes, kind='stable')
    ordered = hashes[order]
    equal = ordered[1:] == ordered[:-1]
    if not equal.any():
        return
    candidates = np.unique(np.concatenate([order[1:][equal], order[:-1][equal]]))
    docnos = pd.Series(np.asarray(lookup(candidates), dtype=object), index=candidates)
    repeated = docnos[docnos.duplicated(keep=False)]
    if len(repeated):  # else only a hash collision
        docno = repeated.iloc[0]
        docids = repeated.index[repeated == docno][:2].tolist()
        raise ValueError(f'{stage}: docno {docno!r} names more than one document of {source} (docids {docids[0]} '
                         f'and {docids[1]}), so a ranking could hold it twice; {fix}')


def npy_problem(path: Path, shape: Tuple[int, int], dtype: np.dtype) -> Optional[str]:
    """None for a complete C-ordered ``.npy`` matrix of this shape and dtype at ``path``; else why not."""
    if not path.exists():
        return 'there is none'
    try:
        with open(path, 'rb') as f:
            version = np.lib.format.read_magic(f)
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                np.lib.format.read_array_header_2_0
            got_shape, fortran, got_dtype = read_header(f)
            complete = path.stat().st_size == f.tell() + shape[0] * shape[1] * dtype.itemsize
    except (OSError, ValueError):
        return 'it is not a readable .npy file'
    if not (complete and tuple(got_shape) == tuple(shape) and not fortran and got_dtype == dtype):
        return f'it is incomplete or not a {dtype.name} {tuple(shape)} matrix'
    return None
