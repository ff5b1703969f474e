"""The dense index cache of a collection: a pyterrier-dr FlexIndex per (collection, encoder), keyed by content
(the encoder's files, the collection's documents, each document's text hash) and checked on every use."""
import hashlib
import itertools
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import pyterrier as pt

from .. import store
from .._config import check_int
from ..store import flex_index_problem
from .collection import Collection, check_in_corpus, read_fingerprint, slug, write_fingerprint
from .encoders import encoder_fingerprint

logger = logging.getLogger(__name__)

#: A dense index's per-document text hashes (uint64, in the index's docid order).
TEXT_HASHES = 'rdime_text_hashes.npy'
#: Beside a dense index being encoded: the vectors encoded so far (:class:`_EncodedSoFar`).
PARTIAL_SUFFIX = '.encoded-so-far'


def text_hash(text: str) -> int:
    """A 64-bit hash of a text (blake2b of its UTF-8 bytes): what a cached vector was encoded from."""
    return int.from_bytes(hashlib.blake2b(text.encode('utf-8', 'surrogatepass'), digest_size=8).digest(), 'little')


def text_hashes(texts: Iterable[str]) -> np.ndarray:
    """:func:`text_hash` of each text, as uint64."""
    return np.fromiter((text_hash(t) for t in texts), dtype=np.uint64)


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
    from pyterrier_dr import FlexIndex
    with store.locked(path):  # one builder at a time
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
        total = len(wanted) if wanted is not None else (
            collection.num_docs - len(held) if collection.num_docs is not None else None)
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
            with pt.tqdm(total=total, desc='encoding documents', unit='doc', disable=not verbose) as progress:
                try:
                    for chunk in iter(lambda: list(itertools.islice(fresh, batch_size)), []):
                        docnos, texts = [doc['docno'] for doc in chunk], [doc['text'] for doc in chunk]
                        hashes = text_hashes(texts)
                        new_hashes.append(hashes)
                        for docno, vec in zip(docnos, partial.vectors(docnos, hashes, texts, model)):
                            yield {'docno': docno, 'doc_vec': vec}
                        progress.update(len(chunk))
                finally:  # interrupted or done: what is pending is kept
                    partial.flush()

        start = time.time()
        with pt.io.finalized_directory(str(path)) as tmp:
            FlexIndex(tmp, verbose=False).indexer(mode='overwrite').index(records())
            hashes = _ensure_lookup_round_trips(Path(tmp), np.concatenate([cached.hashes] + new_hashes))
            np.save(Path(tmp) / TEXT_HASHES, hashes)
            write_fingerprint(tmp, collection=collection.name, docs=collection.fingerprint, encoder=encoder,
                              encoder_name=encoder_name, complete=needed is None, num_docs=len(hashes))
            shutil.rmtree(path, ignore_errors=True)  # os.replace cannot move a folder over a non-empty one
        shutil.rmtree(partial.folder, ignore_errors=True)  # its vectors are in the index now
        logger.info('encoded the documents in %.0f s', time.time() - start)
        return FlexIndex(str(path), verbose=False)


class _EncodedSoFar:
    """The vectors encoded for a dense index not built yet, kept in chunks beside it so that an interrupted run loses
    at most the last :data:`FLUSH_EVERY` documents (the next run reads back those of the same encoder and text)."""
    FLUSH_EVERY = 4096

    def __init__(self, folder: Path, encoder: str):
        self.folder, self.encoder = folder, encoder
        self.found: Dict[Tuple[str, int], np.ndarray] = {}
        self.pending: List[Tuple[str, int, np.ndarray]] = []
        self.chunks = 0
        for record in sorted(folder.glob('chunk-*.json')) if folder.is_dir() else []:
            try:
                kept = store.read_json(record, 'encoded')
                vecs = np.load(record.with_suffix('.npy'), mmap_mode='r')
                if kept['encoder'] != encoder or not len(kept['docnos']) == len(kept['hashes']) == len(vecs):
                    continue
            except (OSError, ValueError, KeyError, TypeError):
                continue  # a chunk cut short by a kill, or another version's: encoded again
            self.found.update(zip(zip(kept['docnos'], kept['hashes']), vecs))
            self.chunks += 1
        if self.found:
            logger.info('%s: %d documents encoded by an interrupted run are read back', folder, len(self.found))

    def vectors(self, docnos: List[str], hashes: np.ndarray, texts: List[str], model) -> List[np.ndarray]:
        """The vectors of a batch: read back where an earlier run encoded the same docno and text, else encoded."""
        keys = list(zip(docnos, (int(h) for h in hashes)))
        todo = [i for i, key in enumerate(keys) if key not in self.found]
        out = dict(zip(todo, model.encode_docs([texts[i] for i in todo]) if todo else []))
        self.pending.extend((*keys[i], out[i]) for i in todo)
        if len(self.pending) >= self.FLUSH_EVERY:
            self.flush()
        return [out[i] if i in out else np.asarray(self.found[key]) for i, key in enumerate(keys)]

    def flush(self) -> None:
        """Writes the vectors pending as a chunk: its vectors, then its record (a chunk without one is ignored)."""
        if not self.pending:
            return
        docnos, hashes, vecs = zip(*self.pending)
        self.folder.mkdir(parents=True, exist_ok=True)
        stem = self.folder / f'chunk-{self.chunks:07d}-{os.getpid()}'
        with store.atomic_open(stem.with_suffix('.npy'), 'wb') as f:
            np.save(f, np.stack(vecs).astype(np.float32))
        store.write_json(stem.with_suffix('.json'), 'encoded', {'encoder': self.encoder, 'docnos': docnos,
                                                               'hashes': hashes})
        self.chunks += 1
        self.pending = []


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
    from pyterrier_dr import FlexIndex
    if not (path / 'pt_meta.json').is_file():
        return _Cached()
    try:
        if (problem := flex_index_problem(path)) is not None:  # not a whole FlexIndex
            raise ValueError(problem)
        index = FlexIndex(str(path), verbose=False)
        docnos = _docnos(index)
        hashes = np.load(path / TEXT_HASHES) if (path / TEXT_HASHES).is_file() else None
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
        round_trips = _lookup_round_trips(index, docnos)
        if not round_trips:
            logger.warning('%s: its docno lookup gives some documents another row (an npids bug with long runs of '
                           'consecutive integer docnos); rewriting it in another order, no document encoded again',
                           path)
        return _Cached(index, np.arange(len(docnos)), docnos, hashes, round_trips, bool(recorded.get('complete')))
    removed = set(collection.absent(docnos))
    now = {doc['docno']: text_hash(doc['text']) for doc in collection.docs([d for d in docnos if d not in removed])}
    keep = np.array([now.get(d) == int(h) for d, h in zip(docnos, hashes)], dtype=bool)
    # documents the index lacks: added since (complete index), or possibly never needed (a re-ranking's candidates)
    others = None if collection.num_docs is None else collection.num_docs - len(now)
    others_note = '' if others is None else f', {others} added' if recorded.get('complete') else (
        f'; the corpus holds {others} other documents that this partial index does not')
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
    vecs, docnos = index.payload(return_docnos=False)[0], _docnos(index)
    if _lookup_round_trips(index, docnos):
        return hashes
    order = np.argsort([hashlib.sha1(d.encode()).hexdigest() for d in docnos], kind='stable')
    rewritten = folder.with_name(folder.name + '.reordered')
    shutil.rmtree(rewritten, ignore_errors=True)
    FlexIndex(str(rewritten), verbose=False).indexer(mode='overwrite').index(
        {'docno': docnos[i], 'doc_vec': np.asarray(vecs[i])} for i in order)
    del index, vecs
    shutil.rmtree(folder)
    os.replace(rewritten, folder)
    if not _lookup_round_trips(FlexIndex(str(folder), verbose=False), [docnos[i] for i in order]):
        raise RuntimeError(f'{folder}: the docno lookup of this index finds documents at other rows even after '
                           'rewriting it; please report this bug')
    return hashes[order]


def _docnos(index) -> List[str]:
    """The docnos of a FlexIndex, in docid order."""
    lookup = index.payload(return_dvecs=False)[0]
    return [str(d) for d in lookup.fwd[np.arange(len(lookup))]]


def adopt_index(folder: Union[str, Path], collection: Collection, encoder_name: str,
                cache_dir: Union[str, Path]) -> Path:
    """Moves a FlexIndex without a fingerprint, encoded from ``collection`` with ``encoder_name``, into
    :func:`dense_index`'s cache, recording what it was built from (taken on trust), and returns its new path."""
    from pyterrier_dr import FlexIndex
    folder = Path(folder)
    if not (folder / 'pt_meta.json').is_file():
        raise ValueError(f'adopt_index: {folder} is not a pyterrier-dr FlexIndex (no pt_meta.json)')
    docnos = _docnos(FlexIndex(str(folder), verbose=False))
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
