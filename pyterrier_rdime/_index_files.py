"""The files this package keeps beside a pyterrier-dr FlexIndex: where they go, how the vectors are streamed and read,
and :func:`vector_stats`."""
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
#: Documents per block of a streaming pass over the vectors (``block x dims x 4`` bytes).
STREAM_BLOCK = 32768


def portable_index(index: object) -> object:
    """The index as it should travel to another process: a FlexIndex by path (not its open vectors)."""
    if isinstance(index, np.ndarray) or not hasattr(index, 'index_path'):
        return index
    return type(index)(str(index.index_path), sim_fn=index.sim_fn, verbose=index.verbose)


def flex_layout_path(index: object) -> Path:
    """Where a FlexIndex's layout, and beside it every derived file, is stored: the index folder if writable, else
    ``default_cache_dir()/layouts``."""
    folder = Path(index.index_path)
    beside, source = os.path.join(folder, LAYOUT_NAME), os.path.join(folder, 'vecs.f4')
    if os.path.exists(beside) or os.access(folder, os.W_OK) or not os.path.isfile(source):  # not built: no write
        return Path(beside)
    key = hashlib.sha1(f'{folder.resolve()}:{os.stat(source).st_size}'.encode()).hexdigest()[:16]
    return default_cache_dir() / 'layouts' / f'{folder.name}-{key}.npy'


def check_finite(rows: np.ndarray, start: int, docnos: Optional[object], stage: str, source: str) -> None:
    """Fails, naming the first document (docno and docid) with a NaN or infinite value (it would score NaN)."""
    finite = np.isfinite(rows).all(axis=1)
    if not finite.all():
        docid = start + int(np.argmin(finite))
        docno = str(docid) if docnos is None else str(docnos[docid])
        raise ValueError(f'{stage}: document {docno!r} (docid {docid}) of {source} has NaN or infinite values in its '
                         'vector: it would score NaN, which cannot be ranked against real scores; re-encode it or '
                         'rebuild the index without it')


@contextlib.contextmanager
def row_reader(vecs: np.ndarray):
    """``read(start, stop) -> (stop - start, dims) float32`` rows of ``vecs``; a memory map is read with plain file
    reads, each block then dropped from the page cache, so a streaming pass does not evict what the searches need."""
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
    """The rows of a float32 memory map (a FlexIndex's ``vecs.f4``) read by ``rows[docids]`` through a map of their
    own, advised ``MADV_RANDOM``: the kernel's read-ahead around scattered rows would read far more than them."""

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
    """``{'abs_max', 'variance'}`` of each dimension over a FlexIndex's vectors (float64), from one streaming pass,
    kept in ``rdime.dim_major.stats.json``; later calls only ``stat`` the vectors."""
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
