"""Searches of several systems that differ only in the query vector in as few retriever calls as possible: at
collection scale each call scans the whole index."""
from typing import Callable, Dict, Hashable, Iterator, List, Optional, Tuple

import numpy as np
import pandas as pd
import pyterrier as pt

#: Query rows per retriever call (eleven systems of DL19's 43 queries): bounds the call's result frame and heaps.
BATCH_QUERIES = 512


def search_together(retriever: pt.Transformer, queries: Dict[Hashable, Callable[[], pd.DataFrame]],
                    run: Optional[Callable[[pt.Transformer, pd.DataFrame], pd.DataFrame]] = None,
                    batch_queries: int = BATCH_QUERIES) -> Iterator[Tuple[Hashable, pd.DataFrame]]:
    """Yields ``(key, retriever(queries[key]()))`` for each key, in order, stacking consecutive systems' frames up to
    ``batch_queries`` rows into one call of ``run(retriever, frame)`` (default ``retriever(frame)``).

    Each row is searched under a qid of its own, then each system's result is rebuilt as the retriever builds one.
    A retriever that scores each query on its own gives the frames of one call per system bit for bit; a BLAS matrix
    product may differ in the last bits (~1e-6 relative), as with ``--workers``."""
    run = run or (lambda stage, frame: stage(frame))
    chunk: List[Tuple[Hashable, pd.DataFrame]] = []
    for key, build in queries.items():
        frame = build().reset_index(drop=True)
        if chunk and sum(len(f) for _, f in chunk) + len(frame) > batch_queries:
            yield from _search(retriever, run, chunk)
            chunk = []
        chunk.append((key, frame))
    if chunk:
        yield from _search(retriever, run, chunk)


def _search(retriever: pt.Transformer, run: Callable, chunk: List[Tuple[Hashable, pd.DataFrame]]
            ) -> Iterator[Tuple[Hashable, pd.DataFrame]]:
    if len(chunk) == 1:
        key, frame = chunk[0]
        yield key, run(retriever, frame)
        return
    offsets = np.cumsum([0] + [len(frame) for _, frame in chunk])
    vectors = np.concatenate([frame['query_vec'].to_numpy(dtype=object) for _, frame in chunk])
    batch = pd.DataFrame({'qid': np.arange(offsets[-1]).astype(str), 'query_vec': vectors})
    result = run(retriever, batch)
    batch_row = result['qid'].astype(np.int64).to_numpy()
    order = np.argsort(batch_row, kind='stable')  # the batch's row order: a no-op for a retriever that keeps it
    result, batch_row = result.iloc[order].reset_index(drop=True), batch_row[order]
    bounds = np.searchsorted(batch_row, offsets)
    added = [c for c in result.columns if c not in ('qid', 'query_vec')]
    for i, (key, frame) in enumerate(chunk):
        part = result.iloc[bounds[i]:bounds[i + 1]].reset_index(drop=True)
        out = frame.iloc[batch_row[bounds[i]:bounds[i + 1]] - offsets[i]].reset_index(drop=True)
        if 'query_vec' not in result.columns:  # a retriever that drops it (drop_query_vec=True)
            out = out.drop(columns='query_vec')
        yield key, out.assign(**{column: part[column] for column in added})
