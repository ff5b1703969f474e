"""The dimension-major ``(dims, docs)`` float32 copy of an index that :class:`PrunedRetriever` reads.

For a FlexIndex there is one copy per index, on disk: ``rdime.dim_major.npy`` in the index folder (or, when the folder
is read-only, in the cache folder under a name keyed by the index's path and size), memory-mapped read-only, so every
retriever on the index, in every process, shares the operating system's page cache instead of holding its own copy.
It is built once, streaming the index in blocks of documents (bounded memory), into a temporary file renamed into
place only when complete and flushed: an interrupted build leaves nothing that a later run would open. Beside it, a
small JSON record (``rdime.dim_major.json``) holds the fingerprint of each file it was built from (``vecs.f4``,
and ``docnos.npids``, checked then for a repeated docno), the identity of the layout file it describes and the
largest absolute value of each dimension, and is written after the layout is renamed into place. On open, each
source is checked by :func:`pyterrier_rdime._index_files.current_sources`: a ``stat`` while nothing changed, a full
hash where a time or the inode moved, a rebuild where the size or the content differs.

A rebuild warns, naming the reason. An array index gets an in-memory copy instead (its docnos checked once, there).

Longer than the package's ~250-line habit on purpose: the build, its fault safety (temporary file, lock, record) and
the check on every open are one atomic protocol, easier to audit in one place than spread over modules.
"""
import contextlib
import os
import threading
import warnings
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence, Tuple

import numpy as np
import pandas as pd
import pyterrier as pt

from .._index_files import (
    SOURCES,
    RowFile,
    check_built,
    check_finite,
    current_sources,
    exclusive,
    fingerprint,
    flex_layout_path,
    identity,
    portable_index,
    read_json,
    row_reader,
    vector_stats,
    write_json,
)
from .._io import atomic_open

#: Docnos hashed at a time when looking for a repeated one (their text is held only a block at a time).
DOCNO_BLOCK = 2 ** 20
#: Documents per block when building: ``2 x block x dims x 4`` bytes of memory (200 MiB for 768 dimensions).
BUILD_BLOCK = 32768

_REGISTRY_LOCK = threading.Lock()
_BUILD_LOCKS: Dict[Path, threading.Lock] = {}
_OPEN: Dict[Path, Tuple[Tuple[int, int, int], np.ndarray, np.ndarray]] = {}


class Layout:
    """The dimension-major matrix and the docnos of one index, opened (or built) on first use. Thread-safe: two threads
    asking at once get the same matrix, built once. Pickles without the matrix (a memory map, or a copy that the
    other side rebuilds), so a worker process reopens the shared file.

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
        self._matrix: Optional[np.ndarray] = None
        self._abs_max: Optional[np.ndarray] = None
        self._docno_array: Optional[np.ndarray] = None
        self._row_file: Optional[RowFile] = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state['index'] = portable_index(self.index)
        for transient in ('_lock', '_matrix', '_abs_max', '_docno_array', '_row_file'):
            state.pop(transient)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._matrix = None
        self._abs_max = None
        self._docno_array = None
        self._row_file = None

    @property
    def is_array(self) -> bool:
        return isinstance(self.index, np.ndarray)

    @property
    def shape(self) -> Tuple[int, int]:
        """``(dims, docs)`` of the index, read from its metadata (no copy is opened or built)."""
        if self.is_array:
            return self.index.shape[1], self.index.shape[0]
        check_built(self.index, self.stage)
        meta = self.index.payload(return_dvecs=False, return_docnos=False)[0]
        return int(meta['vec_size']), int(meta['doc_count'])

    def matrix(self) -> np.ndarray:
        """The ``(dims, docs)`` float32 C-contiguous matrix (for a FlexIndex, the on-disk layout, built on first
        use)."""
        self._open()
        return self._matrix

    def has_matrix(self) -> bool:
        """Whether the float32 matrix is at hand without a build: an array index, a layout opened here, or a FlexIndex
        layout on disk that matches the index (``stat`` only)."""
        if self.is_array or self._matrix is not None:
            return True
        if _check(flex_layout_path(self.index), self.shape, Path(self.index.index_path)) is not None:
            return False
        self._open()  # at hand: opened now, so that later calls need no check (each read the layout's record)
        return True

    def abs_max(self) -> np.ndarray:
        """The largest absolute value of each dimension over the documents, float64 ``(dims,)``: bounds the scores.
        For a FlexIndex, from its cached vector statistics (one streaming pass on first use), so that no copy of the
        vectors is built for it."""
        if self.is_array:
            self._open()
            return self._abs_max
        if self._abs_max is None:
            abs_max = vector_stats(self.index, stage=self.stage, verbose=self.verbose)['abs_max']
            check_flex_docnos(self.index, self.stage)
            self._abs_max = abs_max
        return self._abs_max

    def _open(self) -> None:
        if self._matrix is None:
            with self._lock:
                if self._matrix is None:
                    if self.is_array:
                        if self.docnos is not None:
                            self._docno_array = np.asarray(self.docnos, dtype=object)
                            check_unique_docnos(self._docno_array.__getitem__, len(self._docno_array),
                                                stage=self.stage, source='the array index',
                                                fix='give each row its own docno')
                        matrix, self._abs_max = dimension_major(self.index, docnos=self.docnos, stage=self.stage)
                    else:
                        matrix, _ = open_flex_layout(self.index, stage=self.stage, verbose=self.verbose)
                    self._matrix = matrix

    def doc_rows(self) -> Optional[np.ndarray]:
        """The ``(docs, dims)`` float32 C-contiguous vectors the index holds, where there are such (a FlexIndex's
        ``vecs.f4``, memory-mapped; an array index given in that form), else None: the dense path of a FlexIndex
        scores them, and the compressed path re-scores its few documents from their rows."""
        if self.is_array:
            index = self.index
            return index if index.dtype == np.float32 and index.flags.c_contiguous else None
        check_built(self.index, self.stage)
        return self.index.payload(return_docnos=False)[0]

    def rescoring_rows(self) -> Optional[object]:
        """What the compressed path re-scores its few documents from, by ``rows[docids]``: a FlexIndex's ``vecs.f4``
        through a :class:`~pyterrier_rdime._index_files.RowFile` (opened once), an array index's C-ordered rows, else
        None (the dimension-major matrix then)."""
        if self.is_array:
            return self.doc_rows()
        if self._row_file is None:
            self._row_file = RowFile(self.doc_rows())
        return self._row_file

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


def check_flex_docnos(index: object, stage: str) -> None:
    """Refuses a FlexIndex where two documents share a docno (:func:`check_unique_docnos`), once per docno file: a
    record beside the layout (``rdime.dim_major.docnos.json``) keeps the fingerprint of the ``docnos.npids`` found
    unique, checked by ``stat`` afterwards, so that no path, the dense one included, returns a docno twice."""
    folder = Path(index.index_path)
    path = flex_layout_path(index).with_suffix('.docnos.json')
    record = read_json(path)
    sources = record.get('sources') if record is not None else None
    if isinstance(sources, dict) and set(sources) == {'docnos.npids'}:
        if current_sources(sources, folder, verify=True, built='the docno check',
                           save=lambda current: write_json(path, {'sources': current})) is None:
            return
    checked = {'docnos.npids': fingerprint(folder / 'docnos.npids')}  # before the check: a change shows later
    docnos = index.payload(return_dvecs=False)[0]
    check_unique_docnos(docnos.fwd.__getitem__, len(docnos), stage=stage, source=str(folder),
                        fix='index each document once (drop the repeats from the documents) and rebuild the index '
                            "with indexer(mode='overwrite')")
    with contextlib.suppress(OSError):
        write_json(path, {'sources': checked})


def dimension_major(vecs: np.ndarray, *, docnos: Optional[Sequence[str]] = None, stage: str = 'PrunedRetriever',
                    block: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray]:
    """An in-memory ``(dims, docs)`` float32 C-contiguous copy of ``(docs, dims)`` vectors (a view when ``vecs`` is
    already a Fortran-ordered float32 array), filled block by block, and the largest absolute value of each
    dimension; fails on a document with NaN or inf values."""
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


def record_path(path: Path) -> Path:
    """The JSON record that describes the layout at ``path``."""
    return path.with_suffix('.json')


def open_flex_layout(index: object, *, stage: str = 'PrunedRetriever',
                     verbose: bool = False) -> Tuple[np.ndarray, np.ndarray]:
    """The read-only memory-mapped layout of a FlexIndex and the largest absolute value of each dimension, built
    first if the layout is missing or was not built from the index's current vectors and docnos (an index with a
    repeated docno is refused then). Every caller in this process gets the same array; concurrent builds (threads,
    or processes where ``fcntl`` exists) wait for the first one and then open its file."""
    check_built(index, stage)
    meta = index.payload(return_dvecs=False, return_docnos=False)[0]
    shape = (int(meta['vec_size']), int(meta['doc_count']))
    folder = Path(index.index_path)
    source = folder / 'vecs.f4'
    path = flex_layout_path(index)
    with _REGISTRY_LOCK:
        build_lock = _BUILD_LOCKS.setdefault(path, threading.Lock())
    with build_lock:
        with _REGISTRY_LOCK:
            opened = _OPEN.get(path)
        if opened is not None and opened[0] == identity(path) and _check(path, shape, folder) is None:
            return opened[1], opened[2]
        if _check(path, shape, folder) is not None:
            with exclusive(source):  # another process may be building it: wait, then look again (hashing now)
                reason = _check(path, shape, folder, verify=True)
                if reason is not None:
                    if path.exists() or record_path(path).exists():
                        warnings.warn(f'{stage}: rebuilding the dimension-major layout {path}: {reason}',
                                      stacklevel=4)
                    for stale in path.parent.glob(f'.{path.name}.*.tmp'):  # from a killed build: no one writes it now
                        stale.unlink(missing_ok=True)
                    record_path(path).unlink(missing_ok=True)
                    check_flex_docnos(index, stage)
                    docnos, vecs, _ = index.payload()
                    # hashed before the build: vectors changed during it show as a changed ctime on the next open
                    sources = {name: fingerprint(folder / name) for name in SOURCES}
                    abs_max = build_layout(vecs, path, docnos=docnos.fwd, stage=stage, source=str(folder),
                                           verbose=verbose)
                    _write_record(path, sources, abs_max)
        matrix = np.load(path, mmap_mode='r')
        abs_max = np.asarray(_read_record(path)['abs_max'], dtype=np.float64)
        with _REGISTRY_LOCK:
            _OPEN[path] = (identity(path), matrix, abs_max)
        return matrix, abs_max


def build_layout(vecs: np.ndarray, path: Path, *, docnos: Optional[object] = None, stage: str = 'PrunedRetriever',
                 source: str = 'the index', block: Optional[int] = None, verbose: bool = False) -> np.ndarray:
    """Write the ``(dims, docs)`` float32 ``.npy`` layout of ``(docs, dims)`` vectors to ``path``, reading ``block``
    documents at a time (a memory-mapped source is read with plain file reads, so its pages do not pile up in this
    process). The file appears under its name only once complete and flushed to disk. Returns the largest absolute
    value of each dimension.

    Raises:
        ValueError: a document has a NaN or infinite value (named by its docno): it would score NaN, and a NaN score
            cannot be ranked against real ones.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    docs, dims = vecs.shape
    block = block or BUILD_BLOCK
    abs_max = np.zeros(dims)
    with atomic_open(path, 'wb') as out:
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
    """Raise a ValueError naming a docno that two of the ``count`` documents share (``lookup(docids)`` gives their
    docnos): a ranking would hold it twice. The docnos are hashed a block at a time, so an index of millions of
    documents is checked in ~24 bytes of memory per document (hash, order, sorted hash); documents of equal hash are
    then compared by docno."""
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


def _write_record(path: Path, sources: Dict[str, dict], abs_max: Sequence[float]) -> None:
    """The layout's record, written (atomically) after the layout is in place: a build killed before this leaves
    a layout without a record, which is rebuilt."""
    write_json(record_path(path), {'sources': sources, 'layout': list(identity(path)),
                                   'abs_max': [float(x) for x in abs_max]})


def _read_record(path: Path) -> dict:
    record = read_json(record_path(path))
    if record is None:
        raise OSError(f'{record_path(path)} is missing or unreadable')
    return record


def npy_problem(path: Path, shape: Tuple[int, int], dtype: np.dtype) -> Optional[str]:
    """None for a complete C-ordered ``.npy`` matrix of this shape and dtype at ``path``; else why not (no file, not a
    readable ``.npy``, or cut short / another shape or type)."""
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


def _check(path: Path, shape: Tuple[int, int], folder: Path, *, verify: bool = False) -> Optional[str]:
    """None for a complete layout of this shape whose record matches both it and the ``SOURCES`` files of the index
    in ``folder``; else why not. A source whose size, times and inode are as recorded is taken as unchanged (its
    inode change time cannot be set back short of the system clock); one whose size is the same but a time or the
    inode differs is hashed with ``verify`` (else reported as a reason, for the caller to verify under its lock), and
    on the same content the record is brought up to date."""
    problem = npy_problem(path, shape, np.dtype('<f4'))
    if problem is not None:
        return problem + ' (a build was interrupted, or the index changed)'
    try:
        record = _read_record(path)
        if len(record['abs_max']) != shape[0] or sorted(record['sources']) != sorted(SOURCES) or not all(
                {'size', 'mtime_ns', 'ctime_ns', 'inode', 'sha256'} <= set(fields)
                for fields in record['sources'].values()):
            raise ValueError('abs_max or sources')
    except (OSError, ValueError, KeyError, TypeError):
        return (f'its record {record_path(path).name} is missing or unreadable (a build was interrupted, or the '
                'layout predates these records)')
    if tuple(record['layout']) != identity(path):
        return f'its record {record_path(path).name} describes another file (a build was interrupted)'
    return current_sources(record['sources'], folder, verify=verify, built='the layout',
                           save=lambda sources: _write_record(path, sources, record['abs_max']))
