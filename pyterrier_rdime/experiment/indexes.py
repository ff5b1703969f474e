"""The runner's indexes: the cached dense FlexIndex of a collection, an existing FlexIndex (a folder or a Hugging
Face repository), the retrieval backends over it, and the PISA BM25 first stage."""
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
from typing import Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import pandas as pd
import pyterrier as pt

from .._config import check_int, hub_offline
from .collection import Collection, check_in_corpus, iter_texts, read_trec_run
from .encoders import encoder_fingerprint
from .fingerprint import TEXT_HASHES, read_fingerprint, text_hash, text_hashes, write_fingerprint

logger = logging.getLogger(__name__)

#: ``--retriever`` choices for full dense retrieval: name -> what it is.
RETRIEVERS = {
    'numpy': "pyterrier-dr's exact numpy retriever (memory-mapped, default)",
    'torch': "pyterrier-dr's exact torch retriever (GPU when present; loads the vectors into memory)",
    'faiss-flat': 'FAISS exact inner-product index (pip install faiss-cpu)',
    'faiss-hnsw': 'FAISS HNSW graph, approximate (pip install faiss-cpu)',
    'faiss-ivf': 'FAISS IVF, approximate (pip install faiss-cpu)',
    'pruned': "this package's PrunedRetriever: exact, scores only the kept dimensions",
}


def encoder_slug(name: str) -> str:
    """The cache folder name of an encoder: its name (a folder's own name, not its path) and a digest of its content
    (:func:`encoder_fingerprint`), so that local folders, often all called 'model', do not share one, and a cache
    copied to another machine or virtual environment is found again."""
    digest = hashlib.sha1(encoder_fingerprint(name).encode()).hexdigest()[:8]
    label = Path(name).expanduser().resolve().name if Path(name).expanduser().is_dir() else name
    return re.sub(r'[^A-Za-z0-9_.-]+', '_', label)[-60:] + f'-{digest}'


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

    With ``docnos`` only those documents are needed: a cached index that holds them all is reused, otherwise only the
    missing ones are encoded and added. ``docnos=None`` needs the whole corpus. The cache records what it was built
    from (:func:`dense_index_path`, :data:`FINGERPRINT`): the encoder's content and the collection's, and the hash
    of each document's text. When the collection changed, the vectors of unchanged documents are kept, changed and
    new ones encoded, removed ones dropped, and one line says so; when the encoder changed, or the cache has no
    fingerprint, everything is encoded again. A docno the corpus lacks is an error naming it, before any encoding.
    A killed run leaves the cached index as it was (the new one is written beside it and moved into place).
    """
    check_int('dense_index', 'batch_size (--batch-size)', batch_size, 1)
    needed = None if docnos is None else list(dict.fromkeys(str(d) for d in docnos))
    if needed is not None:
        check_in_corpus(collection, needed, 'the ranking to re-score')
    path = dense_index_path(collection, encoder_name, cache_dir)
    with _building(path):
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
    logger.info('encoding %s documents of %s into %s', 'all the' if total is None else total, collection.name, path)
    vectors = cached.index.payload(return_docnos=False)[0] if cached.index is not None else None
    new_hashes: List[np.ndarray] = []

    def records() -> Iterator[dict]:
        """Streams the reused vectors, then the new ones a batch at a time (bounded memory, a progress bar that
        moves with every batch)."""
        for docid, docno in zip(cached.docids, cached.docnos):
            yield {'docno': docno, 'doc_vec': np.asarray(vectors[docid])}
        new_docs = (doc for doc in iter_texts(collection, wanted) if doc['docno'] not in held)
        with pt.tqdm(total=total, desc='encoding documents', unit='doc', disable=not verbose) as progress:
            for chunk in iter(lambda: list(itertools.islice(new_docs, batch_size)), []):
                texts = [doc['text'] for doc in chunk]
                new_hashes.append(text_hashes(texts))
                for doc, vec in zip(chunk, model.encode_docs(texts)):
                    yield {'docno': doc['docno'], 'doc_vec': vec}
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
    logger.info('encoded the documents in %.0f s', time.time() - start)
    return FlexIndex(str(path), verbose=False)


@contextlib.contextmanager
def _building(path: Path) -> Iterator[None]:
    """Held while the cache entry ``path`` is checked and built: one builder at a time (a second process waits,
    then finds the entry built), and what a killed builder left (``pt.io.finalized_directory``'s hidden temporary
    folders beside ``path``) is removed, since no other builder can be running."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # Windows: no advisory locks; concurrent builders still each write a whole entry
        yield
        return
    with open(path.parent / f'.{path.name}.lock', 'w') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stem, suffix = os.path.splitext(path.name)
        for leftover in path.parent.glob(f'.{stem}.*.tmp{suffix}'):
            shutil.rmtree(leftover, ignore_errors=True)
        yield


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
    now = {doc['docno']: text_hash(doc['text']) for doc in collection.docs(docnos)}
    keep = np.array([now.get(d) == int(h) for d, h in zip(docnos, hashes)], dtype=bool)
    logger.warning('%s: the documents of %s changed since this index was built (%d of its %d documents changed, %d '
                   'removed); keeping the %d other vectors', path, collection.name, len(now) - keep.sum(),
                   len(docnos), len(docnos) - len(now), keep.sum())
    docids = np.flatnonzero(keep)
    return _Cached(index, docids, [docnos[i] for i in docids], hashes[docids])


def _lookup_round_trips(index, docnos: Sequence[str]) -> bool:
    """Whether the index's docno lookup finds every document at its own row. npids (pyterrier-dr's docno store)
    encodes runs of 256 or more consecutive integer docnos compactly, and its reverse lookup over several such runs
    compares the docno, not its offset in the run, with the run's length: cranfield's docnos 1..1400 in corpus order
    give 877 of 1,397 documents another row or none, and every vector loaded for them would be another document's."""
    lookup = index.payload(return_dvecs=False)[0]
    return bool(np.array_equal(np.asarray(lookup.inv[list(docnos)]), np.arange(len(docnos))))


def _ensure_lookup_round_trips(folder: Path, hashes: np.ndarray) -> np.ndarray:
    """Rewrites the FlexIndex just built in ``folder`` in the order of its docnos' digests when its lookup does not
    round-trip (:func:`_lookup_round_trips`; no run of consecutive integers survives that order), and returns the
    text hashes in the new order. Fails, naming the folder, if even that order does not round-trip."""
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
    """The cached FlexIndex at ``path``, its docnos and its text hashes (``None`` when it has none); raises when a
    file is missing, malformed or of the wrong size."""
    from pyterrier_dr import FlexIndex
    index = FlexIndex(str(path), verbose=False)
    lookup, meta = index.payload(return_dvecs=False)
    expected = meta['doc_count'] * meta['vec_size'] * np.dtype(np.float32).itemsize
    if (path / 'vecs.f4').stat().st_size != expected or len(lookup) != meta['doc_count']:
        raise ValueError(f'vecs.f4 or docnos.npids does not hold the {meta["doc_count"]} vectors of pt_meta.json')
    docnos = [str(d) for d in lookup.fwd[np.arange(meta['doc_count'])]]
    hashes = np.load(path / TEXT_HASHES) if (path / TEXT_HASHES).is_file() else None
    return index, docnos, hashes


def adopt_index(folder: Union[str, Path], collection: Collection, encoder_name: str,
                cache_dir: Union[str, Path]) -> Path:
    """Moves a FlexIndex that was encoded from ``collection`` with ``encoder_name`` without a fingerprint (by hand,
    or by a version before fingerprints) into :func:`dense_index`'s cache, recording what it was built from, and
    returns its new path. Its documents must be exactly those of the collection now, encoded with these encoder
    files: that is taken on trust. Whether it holds the whole corpus is read from its documents."""
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


def check_index_spec(spec: str) -> None:
    """Fails, with the fix, when ``--index`` is neither a FlexIndex folder nor a Hugging Face repository id that can
    be downloaded now: checked before any model loads."""
    local = Path(spec).expanduser()
    if local.exists():
        if not (local / 'pt_meta.json').is_file():
            raise ValueError(f'--index {spec}: {local} is not a pyterrier-dr FlexIndex (no pt_meta.json); build one '
                             'with (model >> FlexIndex(path).indexer()).index(docs), or pass a Hugging Face '
                             'repository id such as macavaney/msmarco-passage.tasb.flex')
        return
    if not re.fullmatch(r'[\w.-]+/[\w.-]+(@[\w.-]+)?', spec):
        raise ValueError(f'--index {spec!r} is neither an existing folder nor a Hugging Face repository id '
                         '(owner/name)')
    if hub_offline():
        raise ConnectionError(f'--index {spec!r}: the Hugging Face hub cannot be reached (offline), so the prebuilt '
                              'index cannot be downloaded. Run on a machine with network, or download it there and '
                              'pass the local folder.')


def existing_index(spec: str):
    """An existing pyterrier-dr FlexIndex: a local folder, or a Hugging Face repository (``owner/name``) loaded with
    pyterrier-dr's own ``FlexIndex.from_hf``. A hub id fails at once, with the fix, when the hub cannot be
    reached."""
    check_index_spec(spec)  # before importing pyterrier-dr (and torch): an unusable spec fails in milliseconds
    from pyterrier_dr import FlexIndex
    local = Path(spec).expanduser()
    if local.exists():
        return FlexIndex(str(local), verbose=False)
    return FlexIndex.from_hf(spec, verbose=False)


def check_index_matches(index, dims: int, encoder_name: str, spec: str) -> None:
    """Fails when the encoder's dimensionality differs from the index's, naming the encoder the index needs."""
    meta = index.payload(return_dvecs=False, return_docnos=False)[0]
    if meta['vec_size'] != dims:
        hint = ''
        for short in ('tasb', 'contriever', 'ance', 'minilm', 'mpnet'):
            if short in str(spec).lower().replace('-', '').replace('_', ''):
                hint = f' (its name suggests --encoder {short})'
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


def retriever(index, backend: str, num_results: int) -> pt.Transformer:
    """The full-retrieval backend ``backend`` (see :data:`RETRIEVERS`) over ``index``, ``num_results`` per query."""
    if backend == 'numpy':
        return index.np_retriever(num_results=num_results)
    if backend == 'torch':
        return index.torch_retriever(num_results=num_results)
    if backend == 'pruned':
        from ..pruned import PrunedRetriever
        return PrunedRetriever(index=index, num_results=num_results)
    if backend.startswith('faiss-'):
        require_faiss()
        if backend == 'faiss-flat':
            return index.faiss_flat_retriever() % num_results
        if backend == 'faiss-hnsw':
            return index.faiss_hnsw_retriever(num_results=num_results)
        return index.faiss_ivf_retriever(num_results=num_results)
    raise ValueError(f'--retriever {backend!r}: choose among {", ".join(RETRIEVERS)}')


def require_faiss() -> None:
    try:
        import faiss  # noqa: F401
    except ImportError:
        raise ImportError("the FAISS retrievers need faiss: pip install faiss-cpu (or faiss-gpu)") from None


@contextlib.contextmanager
def pisa_output_silenced():
    """PISA's C++ engine writes [info] lines and progress straight to the process's stdout and stderr (its
    log_level switch is broken in pyterrier-pisa 0.4.9); used around the runner's own PISA calls only. Errors still
    surface as Python exceptions."""
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
    """PISA BM25 (k1 0.9, b 0.4, porter2) over the collection, the index built once under ``cache_dir``. The index
    is cached only when it holds every document the collection yields, and records what it was built from
    (:data:`FINGERPRINT`): one built from other documents is built again, with one line that says so."""
    import pyterrier_pisa
    path = Path(cache_dir) / collection.slug / 'pisa'
    with _building(path):
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
    if first_stage == 'run':
        run, source = collection.run, "the collection's run"
    elif Path(first_stage).is_file():
        run, source = read_trec_run(first_stage), str(first_stage)
    else:
        raise ValueError(f"--first-stage {first_stage!r} is not 'auto', 'bm25' or an existing TREC run file")
    run = run[run['rank'] < depth]
    check_in_corpus(collection, run['docno'], f'the first-stage run {source}')
    results = run.merge(collection.topics, on='qid')
    if results.empty:
        raise ValueError(f'the first-stage run {source} shares no qid with the queries of {collection.name}')
    return results[['qid', 'query', 'docno', 'score', 'rank']], f'{source} (top {depth})'
