"""The first stage of a re-ranking run: PISA BM25 over the collection (its index cached and fingerprinted), the
collection's own run, or a TREC run file."""
import contextlib
import ctypes
import itertools
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Tuple, Union

import pandas as pd
import pyterrier as pt

from .collection import Collection, check_in_corpus, read_trec_run
from .fingerprint import cache_entry, read_fingerprint, write_fingerprint

logger = logging.getLogger(__name__)


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
    with cache_entry(path):
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
        run = collection.run[collection.run['rank'] < depth]
        source = "the collection's run"
    else:
        run, source = read_trec_run(first_stage), str(first_stage)
        run = run[run['rank'] < depth]
        check_in_corpus(collection, run['docno'], f'the first-stage run {source}')
    results = run.merge(collection.topics, on='qid')
    if results.empty:
        raise ValueError(f'the first-stage run {source} shares no qid with the queries of {collection.name}')
    return results[['qid', 'query', 'docno', 'score', 'rank']], f'{source} (top {depth})'
