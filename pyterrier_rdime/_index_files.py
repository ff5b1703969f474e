"""The files this package keeps beside a pyterrier-dr FlexIndex (where they go, how the vectors are streamed and read)
and the first of them, :func:`vector_stats`: the shared helpers of the stages that read an index (``SameBudget``'s
variance control) and of the retriever's on-disk copies (:mod:`pyterrier_rdime.pruned`), below both. Each is kept by
the one protocol of :mod:`pyterrier_rdime.store`.
"""
import contextlib
import hashlib
import mmap
import os
from pathlib import Path
from typing import Dict, Optional

import numpy as np

from . import maths, store
from ._config import default_cache_dir
from .flex_index import check_whole

#: The float32 dimension-major layout's file name in an index folder; the other derived files take its stem.
LAYOUT_NAME = 'rdime.dim_major.npy'
#: The files of a FlexIndex that derived files are made from: the vectors, and the docnos (checked for repeats).
SOURCES = ('vecs.f4', 'docnos.npids')
#: Documents per block of a streaming pass over the vectors (``block x dims x 4`` bytes: 96 MiB at 768 dimensions).
STREAM_BLOCK = 32768


def portable_index(index: object) -> object:
    """The index as it should travel to another process: a FlexIndex reopened by path (pickling a FlexIndex whose
    vectors are open would copy them all, as a plain array), an array as it is."""
    if isinstance(index, np.ndarray) or not hasattr(index, 'index_path'):
        return index
    return type(index)(str(index.index_path), sim_fn=index.sim_fn, verbose=index.verbose)


def flex_layout_path(index: object) -> Path:
    """Where the layout of a FlexIndex is (or will be) stored, and beside it every other derived file: in the index
    folder if a layout is there or the folder is writable, else in ``default_cache_dir()/layouts`` under a name keyed
    by the index's resolved path and size."""
    folder = Path(index.index_path)
    beside, source = os.path.join(folder, LAYOUT_NAME), os.path.join(folder, 'vecs.f4')
    if os.path.exists(beside) or os.access(folder, os.W_OK) or not os.path.isfile(source):  # not built: no write
        return Path(beside)
    key = hashlib.sha1(f'{folder.resolve()}:{os.stat(source).st_size}'.encode()).hexdigest()[:16]
    return default_cache_dir() / 'layouts' / f'{folder.name}-{key}.npy'


def check_finite(rows: np.ndarray, start: int, docnos: Optional[object], stage: str, source: str) -> None:
    """Fails, naming the first document (docno and docid) with a NaN or infinite value: it would score NaN, and a
    NaN score cannot be ranked against real ones."""
    finite = np.isfinite(rows).all(axis=1)
    if not finite.all():
        docid = start + int(np.argmin(finite))
        docno = str(docid) if docnos is None else str(docnos[docid])
        raise ValueError(f'{stage}: document {docno!r} (docid {docid}) of {source} has NaN or infinite values in its '
                         'vector: it would score NaN, which cannot be ranked against real scores; re-encode it or '
                         'rebuild the index without it')


@contextlib.contextmanager
def row_reader(vecs: np.ndarray):
    """``read(start, stop) -> (stop - start, dims) float32`` rows of ``vecs``; a C-ordered float32 memory map is
    read with plain file reads, so its pages do not pile up in this process, and each block is then dropped from the
    page cache (``POSIX_FADV_DONTNEED``): a streaming pass over MS MARCO's 27 GB of vectors would otherwise mark
    them as the page cache's working set and evict the int8 copy the searches need (measured in the scale
    rehearsal: its first searches read the copy back from disk)."""
    filename = getattr(vecs, 'filename', None)
    if isinstance(vecs, np.memmap) and filename and vecs.dtype == np.float32 and vecs.flags.c_contiguous:
        row_bytes = vecs.shape[1] * 4
        with open(filename, 'rb') as f:
            def read(start: int, stop: int) -> np.ndarray:
                rows = np.empty((stop - start, vecs.shape[1]), dtype=np.float32)
                f.seek(vecs.offset + start * row_bytes)
                if f.readinto(memoryview(rows).cast('B')) != rows.nbytes:
                    raise OSError(f'{filename} ended before document {stop}: the index is truncated')
                if hasattr(os, 'posix_fadvise'):
                    os.posix_fadvise(f.fileno(), vecs.offset + start * row_bytes, rows.nbytes,
                                     os.POSIX_FADV_DONTNEED)
                return rows
            yield read
    else:
        yield lambda start, stop: np.asarray(vecs[start:stop], dtype=np.float32)


class RowFile:
    """The rows of a C-ordered float32 memory map (a FlexIndex's ``vecs.f4``) read by ``rows[docids]`` through a
    memory map of their own, advised ``MADV_RANDOM``: reading a few scattered rows through the index's own map faults
    in the kernel's read-ahead around each (128 KiB or more per 3 KiB row at 768 dimensions), which made the exact
    re-scoring of the compressed path read ~1 GB/s from disk at 8.8M documents for a few MB of rows; without
    read-ahead a row out of the page cache costs its own page or two, and one in it a memory copy (a ``pread`` per
    row, the first fix, cost ~8 us a row: 1-2 ms per query of a top-100, 10-15 % of a query at 1M documents)."""

    def __init__(self, vecs: np.memmap):
        self.filename, self.offset, self.shape = vecs.filename, vecs.offset, vecs.shape
        self._rows: Optional[np.memmap] = None

    def __len__(self) -> int:
        return self.shape[0]

    def __getstate__(self) -> dict:
        return {**self.__dict__, '_rows': None}

    def __getitem__(self, docids) -> np.ndarray:
        if self._rows is None:
            rows = np.memmap(self.filename, dtype=np.float32, mode='r', offset=self.offset, shape=self.shape)
            if hasattr(mmap, 'MADV_RANDOM'):
                rows._mmap.madvise(mmap.MADV_RANDOM)
            self._rows = rows
        return np.asarray(self._rows[np.asarray(docids, dtype=np.int64).reshape(-1)])


def vector_stats(index: object, *, stage: str, verbose: bool = False) -> Dict[str, np.ndarray]:
    """``{'abs_max', 'variance'}``: the largest absolute value and the population variance of each dimension over the
    document vectors of a FlexIndex (float64 ``(dims,)`` each), from one streaming pass (a progress bar with
    ``verbose``; a document with NaN or inf is an error naming it), kept in a record beside the layout
    (``rdime.dim_major.stats.json``) with the fingerprint of ``vecs.f4``: later calls, in this process or another,
    only ``stat`` the vectors (:func:`pyterrier_rdime.store.derived`)."""
    folder = Path(index.index_path)

    def build(path: Path) -> Dict[str, list]:
        docnos, vectors, _ = portable_index(index).payload()  # a fresh map of the current file
        return _stats_pass(vectors, docnos.fwd, stage, str(folder), verbose)
    return store.derived(
        flex_layout_path(index).with_suffix('.stats.json'), 'vector-stats', folder=folder, sources=('vecs.f4',),
        data=False, before_build=lambda: check_whole(index, stage), build=build, what='the vector statistics',
        stage=stage, check=lambda path, content: None if len(content['abs_max']) == len(content['variance']) else
        'its record is unreadable',
        open_with=lambda path, content: {name: np.asarray(content[name], dtype=np.float64)
                                         for name in ('abs_max', 'variance')})


def _stats_pass(vectors: np.ndarray, docnos: object, stage: str, source: str, verbose: bool) -> Dict[str, list]:
    docs, dims = vectors.shape
    if not docs:
        raise ValueError(f'{stage}: {source} holds no documents')
    abs_max = np.zeros(dims)
    from tqdm.auto import tqdm
    with row_reader(vectors) as read, tqdm(total=docs, desc=f'{stage}: vector statistics', unit='doc',
                                           disable=not verbose) as progress:
        def blocks():
            for start in range(0, docs, STREAM_BLOCK):
                rows = read(start, min(docs, start + STREAM_BLOCK))
                check_finite(rows, start, docnos, stage, source)
                np.maximum(abs_max, np.abs(rows).max(axis=0), out=abs_max)
                progress.update(len(rows))
                yield rows
        variance, _ = maths.column_variance(blocks())
    return {'abs_max': abs_max.tolist(), 'variance': variance.tolist()}
