#!/usr/bin/env python
"""The approximate FAISS indexes that ``search --faiss`` sets against this package's exact paths: 8-bit scalar
quantisation with an exact re-ranking of the top k·r (``IndexScalarQuantizer`` in ``IndexRefineFlat``: a user's
int8 alternative, built in seconds, not cached) and HNSW (``IndexHNSWFlat``: its 1M x 768 build takes many minutes
on two cores, so it is built once and cached beside the synthetic index, with its build time), and recall@k.

Building the HNSW index ahead of ``search --faiss`` (in the background; it logs a line per block of documents)::

    python benchmarks/faiss_indexes.py                  # 1M x 768, M = 32, efConstruction 40
    python benchmarks/faiss_indexes.py --hnsw-docs 200000
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Optional, Sequence, Tuple

import common  # first: it sets the environment (offline hub, temporary PyTerrier homes)
import numpy as np
from common import log

from pyterrier_rdime.store import atomic_open

#: HNSW's graph degree and build-time beam width (FAISS's default efConstruction).
HNSW_M = 32
HNSW_EF_CONSTRUCTION = 40
#: Documents added per step of a build (one progress line each).
BLOCK = 50_000


def recall_at(found: Sequence[np.ndarray], exact: Sequence[np.ndarray]) -> float:
    """Mean over queries of the share of the exact top-k found (FAISS's -1 padding counts as a miss)."""
    if not len(exact):
        return float('nan')
    return float(np.mean([len(set(np.asarray(f).tolist()) & set(np.asarray(e).tolist())) / len(e)
                          for f, e in zip(found, exact)]))


def sq8_refine(vecs: np.ndarray, threads: int, sample: Optional[np.ndarray] = None):
    """``IndexRefineFlat(IndexScalarQuantizer(QT_8bit, inner product))`` over ``vecs`` (its own float32 copy for the
    re-ranking, one byte per value for the scan): trained on ``sample`` (row numbers; default every row). Set
    ``k_factor`` on the result to re-rank the top k·r. Returns ``(index, seconds to train and fill)``."""
    import faiss
    faiss.omp_set_num_threads(threads)
    dims = vecs.shape[1]
    start = time.perf_counter()
    base = faiss.IndexScalarQuantizer(dims, faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT)
    index = faiss.IndexRefineFlat(base)  # FAISS's wrapper keeps a reference to base
    index.train(vecs if sample is None else vecs[sample])
    index.add(vecs)
    return index, time.perf_counter() - start


def hnsw_path(cache: Path, index_path: str, docs: int, m: int = HNSW_M,
              ef_construction: int = HNSW_EF_CONSTRUCTION) -> Path:
    """Where the HNSW index of the first ``docs`` documents of the FlexIndex at ``index_path`` is cached: keyed by
    the index's folder name (the synthetic one's holds its size and seed), the documents and the parameters."""
    return Path(cache) / f'{Path(index_path).name}.hnsw{m}-efc{ef_construction}-{docs}.faiss'


def _source_stamp(source: np.ndarray) -> dict:
    """What identifies the vectors an index was built from: their shape and, for a memory-mapped file, its
    modification time (a rewritten index invalidates the cached HNSW graph)."""
    stamp = {'shape': list(source.shape)}
    filename = getattr(source, 'filename', None)
    if filename:
        stamp['mtime'] = os.stat(filename).st_mtime
    return stamp


def hnsw_index(source: np.ndarray, path: Path, docs: Optional[int] = None, m: int = HNSW_M,
               ef_construction: int = HNSW_EF_CONSTRUCTION, threads: int = 1) -> Tuple[object, dict]:
    """An ``IndexHNSWFlat`` (inner product) over the first ``docs`` rows of ``source`` (every row by default):
    read from ``path`` when a build of the same vectors and parameters is cached there (its record beside it, a
    ``.json``), else built block by block (a log line each) and written there atomically. Returns ``(index,
    record)``: the build's seconds, threads and load average, and whether it came from the cache."""
    import faiss
    faiss.omp_set_num_threads(threads)
    docs = len(source) if docs is None else min(docs, len(source))
    path = Path(path)
    record_path = path.with_suffix('.json')
    wanted = {'docs': docs, 'dims': int(source.shape[1]), 'm': m, 'ef_construction': ef_construction,
              'source': _source_stamp(source)}
    if path.is_file() and record_path.is_file():
        record = json.loads(record_path.read_text())
        if {key: record.get(key) for key in wanted} == wanted:
            start = time.perf_counter()
            index = faiss.read_index(str(path))
            log(f'HNSW{m} (efConstruction {ef_construction}) over {docs:,} documents read from {path} in '
                f'{time.perf_counter() - start:.0f} s (built in {record["build_s"]:.0f} s with {record["threads"]} '
                'thread(s))')
            return index, {**record, 'cached': True}
    index = faiss.IndexHNSWFlat(int(source.shape[1]), m, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = ef_construction
    start = time.perf_counter()
    for begin in range(0, docs, BLOCK):
        end = min(docs, begin + BLOCK)
        index.add(np.ascontiguousarray(source[begin:end], dtype=np.float32))
        log(f'HNSW{m} (efConstruction {ef_construction}, {threads} thread(s)): {end:,} / {docs:,} documents in '
            f'{time.perf_counter() - start:.0f} s (load {os.getloadavg()[0]:.1f})')
    build_s = time.perf_counter() - start
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path, 'wb') as out:
        faiss.write_index(index, faiss.PyCallbackIOWriter(out.write))
    record = {**wanted, 'build_s': build_s, 'threads': threads, 'load_average': os.getloadavg()[0],
              'faiss': faiss.__version__}
    with atomic_open(record_path) as out:
        json.dump(record, out)
    log(f'HNSW index written to {path} ({path.stat().st_size / 2 ** 30:.2f} GiB)')
    return index, {**record, 'cached': False}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description='Builds and caches the HNSW index that search --faiss reads.')
    common.synthetic_index_options(parser)
    parser.add_argument('--hnsw-docs', type=int, help='index only the first N documents (default: all)')
    args = parser.parse_args(argv)
    index, _ = common.synthetic_flex_index(args.cache, args.docs, args.dims)
    source = index.payload()[1]
    docs = min(args.hnsw_docs or len(source), len(source))
    hnsw_index(source, hnsw_path(args.cache, index.index_path, docs), docs, threads=args.threads)
    return 0


if __name__ == '__main__':
    sys.exit(main())
