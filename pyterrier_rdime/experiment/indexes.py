"""The retrievers of a run: the first stage of a re-ranking (PISA BM25 over the collection, its index cached and
fingerprinted, the collection's own run, or a TREC run file); an existing FlexIndex (a folder or a Hugging Face
repository), checked against the encoder and the ranking; and the full-retrieval backends over a dense index."""
import contextlib
import ctypes
import hashlib
import itertools
import logging
import os
import re
import shutil
import sys
from pathlib import Path
from typing import List, Optional, Sequence, Tuple, Union

import pandas as pd
import pyterrier as pt

from .. import store
from .._config import hub_offline
from ..store import FLEX_FILES, flex_index_problem
from .collection import Collection, check_in_corpus, read_fingerprint, read_trec_run, slug, write_fingerprint

logger = logging.getLogger(__name__)

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


def check_index_spec(spec: str) -> None:
    """Fails, with the fix, when ``--index`` is neither a FlexIndex folder nor a reachable hub repository."""
    local = Path(spec).expanduser()
    if local.exists():
        problem = flex_index_problem(local)
        if problem is not None:
            raise ValueError(f'--index {spec}: not a complete pyterrier-dr FlexIndex: {problem}; build it with '
                             "(model >> FlexIndex(path).indexer(mode='overwrite')).index(docs), or pass a Hugging "
                             'Face repository id such as macavaney/msmarco-passage.tasb.flex')
        return
    if not re.fullmatch(r'[\w.-]+/[\w.-]+(@[\w.-]+)?', spec):
        raise ValueError(f'--index {spec!r} is neither an existing folder nor a Hugging Face repository id '
                         '(owner/name)')
    if hub_offline():
        raise ConnectionError(f'--index {spec!r}: the Hugging Face hub cannot be reached (offline), so the prebuilt '
                              'index cannot be downloaded. Run on a machine with network, or download it there and '
                              'pass the local folder.')


def existing_index(spec: str):
    """An existing pyterrier-dr FlexIndex: a local folder, or a Hugging Face repository (``FlexIndex.from_hf``)."""
    check_index_spec(spec)  # before importing pyterrier-dr (and torch): an unusable spec fails in milliseconds
    from pyterrier_dr import FlexIndex
    local = Path(spec).expanduser()
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
        from ..pruned import ShardedPrunedRetriever
        return ShardedPrunedRetriever(shards=index_shards(index, shards, cache_dir), num_results=num_results)
    if backend == 'pruned':
        from ..pruned import PrunedRetriever
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
    from ..pruned import split_flex_index
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
        check_in_corpus(collection, run['docno'], f'the first-stage run {source}')
    results = run.merge(collection.topics, on='qid')
    if results.empty:
        raise ValueError(f'the first-stage run {source} shares no qid with the queries of {collection.name}')
    return results[['qid', 'query', 'docno', 'score', 'rank']], f'{source} (top {depth})'
