"""The dense index cache of a collection: a pyterrier-dr FlexIndex per (collection, encoder), keyed by content
(the encoder's files, the collection's documents, each document's text) and checked on every use."""
import hashlib
import itertools
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import pyterrier as pt

from .._config import check_int
from ..flex_index import flex_index_problem
from ..store import atomic_open
from .collection import Collection, check_in_corpus
from .encoders import encoder_fingerprint
from .fingerprint import (
    TEXT_HASHES,
    cache_entry,
    read_fingerprint,
    slug,
    text_hash,
    text_hashes,
    write_fingerprint,
)

logger = logging.getLogger(__name__)


def encoder_slug(name: str) -> str:
    """The cache folder name of an encoder: its name and a digest of its content (:func:`encoder_fingerprint`), so
    that local folders all called 'model' do not share one."""
    digest = hashlib.sha1(encoder_fingerprint(name).encode()).hexdigest()[:8]
    return slug(Path(name).expanduser().resolve().name if Path(name).expanduser().is_dir() else name, digest)


def dense_index_path(collection: Collection, encoder_name: str, cache_dir: Union[str, Path]) -> Path:
    """Where :func:`dense_index` caches the FlexIndex of ``collection`` encoded with ``encoder_name``."""
    return Path(cache_dir) / collection.slug / f'{encoder_slug(encoder_name)}.flex'


@dataclass
class _Cached:
    """The vectors of a cached index that may be reused: their docids in it, docnos and text hashes."""
    index: object = None
    docids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    docnos: List[str] = field(default_factory=list)
    hashes: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.uint64))
    current: bool = False  # built from the collection's present content: every vector valid, none of a removed doc
    complete: bool = False  # and holds every document of the corpus


def dense_index(collection: Collection, model, encoder_name: str, cache_dir: Union[str, Path],
                docnos: Optional[Sequence[str]] = None, *, batch_size: int = 32, verbose: bool = True):
    """A FlexIndex of ``collection`` encoded with ``model`` (named ``encoder_name``), cached under ``cache_dir``.

    With ``docnos`` only those documents are needed (``None``: the whole corpus); only the ones the cache lacks are
    encoded. The cache records the encoder's content, the collection's and each document's text hash
    (:data:`FINGERPRINT`): unchanged documents keep their vectors; a changed encoder encodes everything again. A
    killed run leaves the cached index as it was, and the next run reads back what it encoded (:class:`_EncodedSoFar`).
    """
    check_int('dense_index', 'batch_size (--batch-size)', batch_size, 1)
    needed = None if docnos is None else list(dict.fromkeys(str(d) for d in docnos))
    path = dense_index_path(collection, encoder_name, cache_dir)
    with cache_entry(path):
        return _dense_index(path, collection, model, encoder_name, needed, batch_size, verbose)


def _dense_index(path: Path, collection: Collection, model, encoder_name: str, needed: Optional[List[str]],
                 batch_size: int, verbose: bool):
    """:func:`dense_index` once it holds the cache entry ``path``."""
    from pyterrier_dr import FlexIndex
    encoder = encoder_fingerprint(encoder_name)
    cached = _cached_vectors(path, collection, encoder)
    held = set(cached.docnos)
    if cached.current and (cached.complete or (needed is not None and held.issuperset(needed))):
        return cached.index
    wanted = None if needed is None else [d for d in needed if d not in held]
    if wanted is not None and len(held) + len(wanted) == 1:
        wanted += _another_docno(collection, wanted + cached.docnos)
    elif wanted is None and collection.num_docs == 1:
        _another_docno(collection, [doc['docno'] for doc in collection.docs(None)])
    if wanted is not None:
        total = len(wanted)
    else:
        total = collection.num_docs - len(held) if collection.num_docs is not None else None
    new_docs = collection.docs(wanted)  # a docno the corpus lacks fails here, before any encoding
    logger.info('encoding %s documents of %s into %s', 'all the' if total is None else total, collection.name, path)
    vectors = cached.index.payload(return_docnos=False)[0] if cached.index is not None else None
    new_hashes: List[np.ndarray] = []
    partial = _EncodedSoFar(path.with_name(path.name + PARTIAL_SUFFIX), encoder)

    def records() -> Iterator[dict]:
        """Streams the reused vectors, then the new ones a batch at a time (bounded memory)."""
        for docid, docno in zip(cached.docids, cached.docnos):
            yield {'docno': docno, 'doc_vec': np.asarray(vectors[docid])}
        fresh = (doc for doc in new_docs if doc['docno'] not in held)
        with pt.tqdm(total=total, desc='encoding documents', unit='doc', disable=not verbose) as progress, partial:
            for chunk in iter(lambda: list(itertools.islice(fresh, batch_size)), []):
                docnos, texts = [doc['docno'] for doc in chunk], [doc['text'] for doc in chunk]
                hashes = text_hashes(texts)
                new_hashes.append(hashes)
                for docno, vec in zip(docnos, partial.vectors(docnos, hashes, texts, model)):
                    yield {'docno': docno, 'doc_vec': vec}
                progress.update(len(chunk))

    start = time.time()
    with pt.io.finalized_directory(str(path)) as tmp:
        FlexIndex(tmp, verbose=False).indexer(mode='overwrite').index(records())
        hashes = np.concatenate([cached.hashes] + new_hashes)
        hashes = _ensure_lookup_round_trips(Path(tmp), hashes)
        np.save(Path(tmp) / TEXT_HASHES, hashes)
        write_fingerprint(tmp, collection=collection.name, docs=collection.fingerprint, encoder=encoder,
                          encoder_name=encoder_name, complete=needed is None, num_docs=len(hashes))
        shutil.rmtree(path, ignore_errors=True)  # os.replace cannot move a folder over a non-empty one
    partial.discard()
    logger.info('encoded the documents in %.0f s', time.time() - start)
    return FlexIndex(str(path), verbose=False)


#: Beside a dense index being encoded: the vectors encoded so far (:class:`_EncodedSoFar`).
PARTIAL_SUFFIX = '.encoded-so-far'


class _EncodedSoFar:
    """The vectors encoded for a dense index not built yet, kept in chunks beside it so that an interrupted run loses
    at most the last :data:`FLUSH_EVERY` documents (the next run reads back those of the same encoder and text). A
    context manager around the encoding: leaving it writes what is pending."""
    FLUSH_EVERY = 4096

    def __init__(self, folder: Path, encoder: str):
        self.folder, self.encoder = folder, encoder
        self.found: Dict[Tuple[str, int], np.ndarray] = {}
        self.pending: List[Tuple[str, int, np.ndarray]] = []
        self.chunks = 0
        for record in sorted(folder.glob('chunk-*.json')) if folder.is_dir() else []:
            try:
                kept = json.loads(record.read_text(encoding='utf-8'))
                vecs = np.load(record.with_suffix('.npy'), mmap_mode='r')
                if kept['encoder'] != encoder or not len(kept['docnos']) == len(kept['hashes']) == len(vecs):
                    continue
            except (OSError, ValueError, KeyError, TypeError):
                continue  # a chunk cut short by a kill, or another version's: encoded again
            self.found.update(((d, int(h)), v) for d, h, v in zip(kept['docnos'], kept['hashes'], vecs))
            self.chunks += 1
        if self.found:
            logger.info('%s: %d documents encoded by an interrupted run are read back', folder, len(self.found))

    def vectors(self, docnos: List[str], hashes: np.ndarray, texts: List[str], model) -> List[np.ndarray]:
        """The vectors of a batch: read back where an earlier run encoded the same docno and text, else encoded."""
        keys = list(zip(docnos, (int(h) for h in hashes)))
        todo = [i for i, key in enumerate(keys) if key not in self.found]
        encoded = model.encode_docs([texts[i] for i in todo]) if todo else []
        out = {i: vec for i, vec in zip(todo, encoded)}
        self.pending.extend((*keys[i], out[i]) for i in todo)
        if len(self.pending) >= self.FLUSH_EVERY:
            self._write()
        return [out[i] if i in out else np.asarray(self.found[key]) for i, key in enumerate(keys)]

    def _write(self) -> None:
        if not self.pending:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        stem = self.folder / f'chunk-{self.chunks:07d}-{os.getpid()}'
        with atomic_open(stem.with_suffix('.npy'), 'wb') as f:
            np.save(f, np.stack([np.asarray(vec, dtype=np.float32) for _, _, vec in self.pending]))
        with atomic_open(stem.with_suffix('.json')) as f:
            json.dump({'encoder': self.encoder, 'docnos': [d for d, _, _ in self.pending],
                       'hashes': [h for _, h, _ in self.pending]}, f)
        self.chunks += 1
        self.pending = []

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._write()

    def discard(self) -> None:
        """Removes the chunks once the index holding their vectors is in place."""
        shutil.rmtree(self.folder, ignore_errors=True)


def _another_docno(collection: Collection, docnos: List[str]) -> List[str]:
    """One document of the corpus besides ``docnos``' one: pyterrier-dr's docno lookup (npids) cannot read an index
    of a single document, whose docno is all prefix."""
    other = next((doc['docno'] for doc in collection.docs(None) if doc['docno'] not in docnos), None)
    if other is None:
        raise ValueError(f'collection {collection.name!r} holds one document; a dense index (pyterrier-dr\'s docno '
                         'lookup) needs at least two: add documents to the corpus')
    return [other]


def _cached_vectors(path: Path, collection: Collection, encoder: str) -> _Cached:
    """What of the index cached at ``path`` is still valid for ``collection`` and the encoder ``encoder``."""
    if not (path / 'pt_meta.json').is_file():
        return _Cached()
    try:
        index, docnos, hashes = _read_cached(path)
    except Exception as e:  # whatever makes a cache unreadable (truncated, edited by hand) makes it untrustworthy
        logger.warning('%s: cannot read this cached index (%s: %s); encoding again', path, type(e).__name__, e)
        return _Cached()
    recorded = read_fingerprint(path)
    if recorded is None or hashes is None or len(hashes) != len(docnos):
        logger.warning('%s: no record of what this cached index was built from; encoding again (adopt_index() '
                       'records it for an index known to match)', path)
        return _Cached()
    if recorded.get('encoder') != encoder:
        logger.warning('%s: built with other encoder files (content %s, now %s); encoding again', path,
                       recorded.get('encoder'), encoder)
        return _Cached()
    if recorded.get('docs') == collection.fingerprint:
        if not _lookup_round_trips(index, docnos):
            logger.warning('%s: its docno lookup gives some documents another row (an npids bug with long runs of '
                           'consecutive integer docnos); rewriting it in another order, no document encoded again',
                           path)
            return _Cached(index, np.arange(len(docnos)), docnos, hashes, False, bool(recorded.get('complete')))
        return _Cached(index, np.arange(len(docnos)), docnos, hashes, True, bool(recorded.get('complete')))
    removed = set(collection.absent(docnos))
    now = {doc['docno']: text_hash(doc['text']) for doc in collection.docs([d for d in docnos if d not in removed])}
    keep = np.array([now.get(d) == int(h) for d, h in zip(docnos, hashes)], dtype=bool)
    # documents the index lacks: added since (complete index), or possibly never needed (a re-ranking's candidates)
    others = collection.num_docs - len(now) if collection.num_docs is not None else None
    if others is None:
        others_note = ''
    elif recorded.get('complete'):
        others_note = f', {others} added'
    else:
        others_note = f'; the corpus holds {others} other documents that this partial index does not'
    logger.warning('%s: the documents of %s changed since this index was built (%d of its %d documents changed, %d '
                   'removed%s); keeping the %d other vectors', path, collection.name, len(now) - keep.sum(),
                   len(docnos), len(docnos) - len(now), others_note, keep.sum())
    docids = np.flatnonzero(keep)
    return _Cached(index, docids, [docnos[i] for i in docids], hashes[docids])


def _lookup_round_trips(index, docnos: Sequence[str]) -> bool:
    """Whether the index's docno lookup finds every document at its own row: npids' reverse lookup is wrong over
    several runs of 256+ consecutive integer docnos (cranfield's), which would load other documents' vectors."""
    lookup = index.payload(return_dvecs=False)[0]
    return bool(np.array_equal(np.asarray(lookup.inv[list(docnos)]), np.arange(len(docnos))))


def _ensure_lookup_round_trips(folder: Path, hashes: np.ndarray) -> np.ndarray:
    """Rewrites the FlexIndex in ``folder`` in the order of its docnos' digests when its lookup does not round-trip,
    and returns the text hashes in the new order; fails, naming the folder, if it still does not."""
    from pyterrier_dr import FlexIndex
    index = FlexIndex(str(folder), verbose=False)
    lookup, vecs, _ = index.payload()
    docnos = [str(d) for d in lookup.fwd[np.arange(len(hashes))]]
    if _lookup_round_trips(index, docnos):
        return hashes
    order = np.argsort([hashlib.sha1(d.encode()).hexdigest() for d in docnos], kind='stable')
    rewritten = folder.with_name(folder.name + '.reordered')
    shutil.rmtree(rewritten, ignore_errors=True)
    FlexIndex(str(rewritten), verbose=False).indexer(mode='overwrite').index(
        {'docno': docnos[i], 'doc_vec': np.asarray(vecs[i])} for i in order)
    del index, lookup, vecs
    for name in os.listdir(folder):
        target = folder / name
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    for name in os.listdir(rewritten):
        shutil.move(str(rewritten / name), str(folder / name))
    rewritten.rmdir()
    if not _lookup_round_trips(FlexIndex(str(folder), verbose=False), [docnos[i] for i in order]):
        raise RuntimeError(f'{folder}: the docno lookup of this index finds documents at other rows even after '
                           'rewriting it; please report this bug')
    return hashes[order]


def _read_cached(path: Path) -> Tuple[object, List[str], Optional[np.ndarray]]:
    """The cached FlexIndex at ``path``, its docnos and its text hashes (``None`` when it has none); raises when it
    is not a whole FlexIndex (:func:`~pyterrier_rdime.flex_index_problem`)."""
    from pyterrier_dr import FlexIndex
    problem = flex_index_problem(path)
    if problem is not None:
        raise ValueError(problem)
    index = FlexIndex(str(path), verbose=False)
    lookup = index.payload(return_dvecs=False)[0]
    docnos = [str(d) for d in lookup.fwd[np.arange(len(lookup))]]
    hashes = np.load(path / TEXT_HASHES) if (path / TEXT_HASHES).is_file() else None
    return index, docnos, hashes


def adopt_index(folder: Union[str, Path], collection: Collection, encoder_name: str,
                cache_dir: Union[str, Path]) -> Path:
    """Moves a FlexIndex without a fingerprint, encoded from ``collection`` with ``encoder_name``, into
    :func:`dense_index`'s cache, recording what it was built from (taken on trust), and returns its new path."""
    from pyterrier_dr import FlexIndex
    folder = Path(folder)
    if not (folder / 'pt_meta.json').is_file():
        raise ValueError(f'adopt_index: {folder} is not a pyterrier-dr FlexIndex (no pt_meta.json)')
    index = FlexIndex(str(folder), verbose=False)
    docnos = [str(d) for d in index.payload(return_dvecs=False)[0].fwd[np.arange(len(index))]]
    check_in_corpus(collection, docnos, f'the index {folder}')
    texts = {doc['docno']: doc['text'] for doc in collection.docs(docnos)}
    np.save(folder / TEXT_HASHES, text_hashes(texts[d] for d in docnos))
    write_fingerprint(folder, collection=collection.name, docs=collection.fingerprint,
                      encoder=encoder_fingerprint(encoder_name), encoder_name=encoder_name,
                      complete=collection.num_docs == len(docnos), num_docs=len(docnos))
    target = dense_index_path(collection, encoder_name, cache_dir)
    if target.resolve() != folder.resolve():
        if target.exists():
            raise ValueError(f'adopt_index: {target} exists already; remove it first to adopt {folder}')
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(folder), str(target))
    return target
