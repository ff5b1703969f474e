"""The indexes and retrievers of a run: the first stage of a re-ranking (PISA BM25 over the collection, its index
cached and fingerprinted, the collection's own run, or a TREC run file); the dense index cache of a collection, a
pyterrier-dr FlexIndex per (collection, encoder) keyed by content (the encoder's files, the collection's documents,
each document's text hash) and checked on every use; an existing FlexIndex (a folder or a Hugging Face repository),
checked against the encoder and the ranking; and the full-retrieval backends over a dense index."""
import contextlib
import ctypes
import hashlib
import itertools
import logging
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import pandas as pd
import pyterrier as pt

from .. import store
from .._config import check_int, hub_offline
from ..pruned import PrunedRetriever, ShardedPrunedRetriever, split_flex_index
from ..store import FLEX_FILES, flex_index_problem
from .collection import Collection, check_in_corpus, read_fingerprint, read_trec_run, slug, write_fingerprint
from .encoders import encoder_fingerprint

logger = logging.getLogger(__name__)

#: A dense index's per-document text hashes (uint64, in the index's docid order).
TEXT_HASHES = 'rdime_text_hashes.npy'
#: Beside a dense index being encoded: the vectors encoded so far (:class:`_EncodedSoFar`).
PARTIAL_SUFFIX = '.encoded-so-far'
#: ``--retriever`` choices for full dense retrieval: name -> what it is.
RETRIEVERS = {
    'numpy': "pyterrier-dr's exact numpy retriever (memory-mapped, default)",
    'torch': "pyterrier-dr's exact torch retriever (GPU when present; loads the vectors into memory)",
    'faiss-flat': 'FAISS exact inner-product index (pip install faiss-cpu)',
    'faiss-hnsw': 'FAISS HNSW graph, approximate (pip install faiss-cpu)',
    'faiss-ivf': 'FAISS IVF, approximate (pip install faiss-cpu)',
    'pruned': "this package's PrunedRetriever: exact, scores only the kept dimensions",
    'sharded': "this package's ShardedPrunedRetriever: PrunedRetriever over --shards shards of the index, one Ray "
               'actor each (on the cluster of --ray-address; the ray extra): the same ranking as pruned',
}


def existing_index(spec: str):
    """An existing pyterrier-dr FlexIndex: a local folder, or a Hugging Face repository (``FlexIndex.from_hf``); an
    incomplete folder, a malformed id or an unreachable hub fails, with the fix, before pyterrier-dr (and torch) load,
    in milliseconds."""
    local = Path(spec).expanduser()
    if local.exists():
        problem = flex_index_problem(local)
        if problem is not None:
            raise ValueError(f'--index {spec}: not a complete pyterrier-dr FlexIndex: {problem}; build it with '
                             "(model >> FlexIndex(path).indexer(mode='overwrite')).index(docs), or pass a Hugging "
                             'Face repository id such as macavaney/msmarco-passage.tasb.flex')
    elif not re.fullmatch(r'[\w.-]+/[\w.-]+(@[\w.-]+)?', spec):
        raise ValueError(f'--index {spec!r} is neither an existing folder nor a Hugging Face repository id '
                         '(owner/name)')
    elif hub_offline():
        raise ConnectionError(f'--index {spec!r}: the Hugging Face hub cannot be reached (offline), so the prebuilt '
                              'index cannot be downloaded. Run on a machine with network, or download it there and '
                              'pass the local folder.')
    from pyterrier_dr import FlexIndex
    return FlexIndex(str(local), verbose=False) if local.exists() else FlexIndex.from_hf(spec, verbose=False)


def check_index_matches(index, dims: int, encoder_name: str, spec: str) -> None:
    """Fails when the encoder's dimensionality differs from the index's, naming the encoder the index needs."""
    meta = index.payload(return_dvecs=False, return_docnos=False)[0]
    if meta['vec_size'] != dims:
        squeezed = str(spec).lower().replace('-', '').replace('_', '')
        hint = next((f' (its name suggests --encoder {short})' for short in ('mpnet', 'minilm', 'ance', 'contriever',
                                                                            'tasb') if short in squeezed), '')
        raise ValueError(f'--index {spec}: the index holds {meta["vec_size"]}-dimensional vectors but the encoder '
                         f'{encoder_name!r} gives {dims}-dimensional ones; pass the --encoder that built the '
                         f'index{hint}')


def check_docnos_in_index(index, docnos: Sequence[str], spec: str) -> None:
    """Fails when documents of the ranking are missing from an existing index."""
    lookup = index.payload(return_dvecs=False)[0]
    docnos = [str(d) for d in docnos]
    missing = [d for d, i in zip(docnos, lookup.inv[docnos]) if i < 0]
    if missing:
        raise ValueError(f'--index {spec}: {len(missing)} of the {len(docnos)} documents needed are not in the '
                         f'index (e.g. {", ".join(map(repr, missing[:3]))}); the index and the collection do not '
                         'match')


def retriever(index, backend: str, num_results: int, *, shards: int = 1,
              cache_dir: Optional[Union[str, Path]] = None, verbose: bool = True) -> pt.Transformer:
    """The full-retrieval backend ``backend`` (:data:`RETRIEVERS`) over ``index``, ``num_results`` per query;
    ``'sharded'`` over ``shards`` shards (:func:`index_shards`)."""
    if backend == 'sharded':
        return ShardedPrunedRetriever(shards=index_shards(index, shards, cache_dir), num_results=num_results)
    if backend == 'pruned':
        return PrunedRetriever(index=index, num_results=num_results, verbose=verbose)
    if backend.startswith('faiss-'):
        require_faiss()
    if backend == 'faiss-flat':  # pyterrier-dr's exact FAISS retriever takes no num_results
        return index.faiss_flat_retriever() % num_results
    method = {'numpy': 'np_retriever', 'torch': 'torch_retriever', 'faiss-hnsw': 'faiss_hnsw_retriever',
              'faiss-ivf': 'faiss_ivf_retriever'}.get(backend)
    if method is not None:
        return getattr(index, method)(num_results=num_results)
    raise ValueError(f'--retriever {backend!r}: choose among {", ".join(RETRIEVERS)}')


def index_shards(index, count: int, cache_dir: Union[str, Path]) -> List[object]:
    """``index`` cut by :func:`~pyterrier_rdime.split_flex_index` into ``count`` FlexIndexes under
    ``cache_dir/shards/``, reused while the index's :data:`FLEX_FILES` are unchanged. For a cluster, ``cache_dir``
    must be a folder every node reads."""
    source = Path(index.index_path).resolve()
    folder = Path(cache_dir) / 'shards' / slug(f'{source.name}-{count}',
                                                key=hashlib.sha256(str(source).encode()).hexdigest()[:12])
    files = [source / name for name in FLEX_FILES]
    cut_from = {'source': str(source), 'files': {f.name: [f.stat().st_size, f.stat().st_mtime_ns] for f in files}}
    with store.locked(folder):
        if read_fingerprint(folder) != cut_from:
            shutil.rmtree(folder, ignore_errors=True)
            split_flex_index(index, folder, count)
            write_fingerprint(folder, **cut_from)
    return [type(index)(str(folder / f'shard-{i}-of-{count}.flex'), sim_fn=index.sim_fn, verbose=False)
            for i in range(count)]


def require_faiss() -> None:
    try:
        import faiss  # noqa: F401
    except ImportError:
        raise ImportError("the FAISS retrievers need faiss: pip install faiss-cpu (or faiss-gpu)") from None


@contextlib.contextmanager
def pisa_output_silenced():
    """Silences PISA's C++ output around the runner's PISA calls (its log_level switch is broken in pyterrier-pisa
    0.4.9); errors still surface as Python exceptions."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    devnull = os.open(os.devnull, os.O_WRONLY)
    libc = ctypes.CDLL(None)
    try:
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        yield
    finally:
        libc.fflush(None)  # C stdio buffers would otherwise reach the restored descriptors
        for fd, copy in zip((1, 2), saved):
            os.dup2(copy, fd)
            os.close(copy)
        os.close(devnull)


def bm25(collection: Collection, cache_dir: Union[str, Path], depth: int) -> pt.Transformer:
    """PISA BM25 (k1 0.9, b 0.4, porter2) over the collection, the index built once under ``cache_dir`` and
    fingerprinted (:data:`FINGERPRINT`): one built from other documents is built again."""
    import pyterrier_pisa
    path = Path(cache_dir) / collection.slug / 'pisa'
    with store.locked(path):
        _build_pisa(path, collection, depth)
    with pisa_output_silenced():
        return pyterrier_pisa.PisaIndex(str(path), stemmer='porter2', text_field='text').bm25(num_results=depth)


def _build_pisa(path: Path, collection: Collection, depth: int) -> None:
    """Builds the PISA index of :func:`bm25` at ``path`` unless it holds the collection's documents already."""
    import pyterrier_pisa
    built = (path / 'pt_meta.json').is_file()
    if built and (read_fingerprint(path) or {}).get('docs') == collection.fingerprint:
        return
    if built:
        logger.warning('%s: built from other documents than those of %s now (or no record of them); building it '
                       'again', path, collection.name)
    logger.info('building the PISA BM25 index of %s', collection.name)
    count, failure = itertools.count(), []

    def counted():
        # PISA prints an exception raised by the documents' iterator and carries on with what it has: keep it to
        # raise it here, once nothing of the partial index is left
        try:
            for doc in collection.docs(None):
                next(count)
                yield doc
        except Exception as e:
            failure.append(e)
    with pt.io.finalized_directory(str(path)) as tmp:
        pisa = pyterrier_pisa.PisaIndex(tmp, stemmer='porter2', text_field='text')
        with pisa_output_silenced():
            pisa.index(counted())
            indexed = pisa.num_docs() if not failure else None
            if not failure:
                pisa.bm25(num_results=depth)  # the first retriever compresses the index: inside the build
        yielded = next(count)
        if failure:
            raise failure[0]
        if indexed != yielded:
            raise RuntimeError(f'PISA indexed {indexed} of the {yielded} documents of {collection.name}; nothing '
                               'was cached')
        write_fingerprint(tmp, collection=collection.name, docs=collection.fingerprint, num_docs=yielded)
        shutil.rmtree(path, ignore_errors=True)  # os.replace cannot move a folder over a non-empty one


def first_stage_results(collection: Collection, first_stage: str, depth: int, cache_dir) -> Tuple[pd.DataFrame, str]:
    """The first ranking (``qid, query, docno, score, rank``, top-``depth``) and a description of its source.

    ``first_stage``: ``'auto'`` (the collection's run if it ships one, else BM25), ``'bm25'``, or a TREC run file.
    """
    if first_stage == 'auto':
        first_stage = 'run' if collection.run is not None else 'bm25'
    if first_stage == 'bm25':
        retriever_ = bm25(collection, cache_dir, depth)
        with pisa_output_silenced():
            results = retriever_(collection.topics)
        return results[['qid', 'query', 'docno', 'score', 'rank']], f'PISA BM25 (top {depth})'
    if first_stage == 'run':  # its docnos were checked when the collection was loaded
        run, source = collection.run[collection.run['rank'] < depth], "the collection's run"
    else:
        run, source = read_trec_run(first_stage), str(first_stage)
        run = run[run['rank'] < depth]
        check_in_corpus(collection.absent, run['docno'], collection.name, f'the first-stage run {source}')
    results = run.merge(collection.topics, on='qid')
    if results.empty:
        raise ValueError(f'the first-stage run {source} shares no qid with the queries of {collection.name}')
    return results[['qid', 'query', 'docno', 'score', 'rank']], f'{source} (top {depth})'


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
    check_in_corpus(collection.absent, docnos, collection.name, f'the index {folder}')
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
