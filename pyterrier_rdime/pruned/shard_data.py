"""What the shards of a :class:`~pyterrier_rdime.ShardedPrunedRetriever` hold and return, without Ray: cutting,
the docno hashes shared, merging top-k."""
import json
import os
from pathlib import Path
from typing import List, Tuple

import numpy as np

from .._config import check_int
from .topk import best_k

#: Documents copied per block by :func:`split_flex_index` (``block x dims x 4`` bytes of memory).
SPLIT_BLOCK = 65536


def shared_hashes(per_shard: List[np.ndarray]) -> np.ndarray:
    """The values that occur more than once in the shards' sorted hash arrays together."""
    merged = np.sort(np.concatenate(per_shard), kind='stable')
    return np.unique(merged[1:][merged[1:] == merged[:-1]])


def merge_shards(per_shard: List[Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]], queries: int,
                 k: int) -> Tuple[list, list, list]:
    """``(scores, docids, docnos)``: each query's global top-``k`` from each shard's ``(bounds, scores, global
    docids, docnos)``, ties to the lower global docid."""
    scores, docids, docnos = [], [], []
    for q in range(queries):
        s = np.concatenate([shard_s[b[q]:b[q + 1]] for b, shard_s, _, _ in per_shard])
        i = np.concatenate([shard_i[b[q]:b[q + 1]] for b, _, shard_i, _ in per_shard])
        n = np.concatenate([shard_n[b[q]:b[q + 1]] for b, _, _, shard_n in per_shard])
        order = best_k(s, i, k)
        scores.append(s[order])
        docids.append(i[order])
        docnos.append(n[order])
    return scores, docids, docnos


def split_flex_index(index: object, folder: str, num_shards: int) -> List[object]:
    """Cut a FlexIndex into ``num_shards`` FlexIndexes of consecutive document ranges, written atomically to
    ``folder/shard-<i>-of-<n>.flex``, in order: ``ShardedPrunedRetriever`` over them ranks as ``PrunedRetriever``
    over ``index``.

    Raises:
        ValueError: ``num_shards`` is not between 1 and the number of documents, or a shard's folder exists.
    """
    import npids
    docnos, meta = index.payload(return_dvecs=False)
    docs, dims = int(meta['doc_count']), int(meta['vec_size'])
    check_int('split_flex_index', 'num_shards', num_shards, 1)
    if num_shards > docs:
        raise ValueError(f'split_flex_index: num_shards={num_shards} is more than the {docs} documents of {index!r}')
    bounds = [docs * i // num_shards for i in range(num_shards + 1)]
    paths = [Path(folder) / f'shard-{i}-of-{num_shards}.flex' for i in range(num_shards)]
    existing = [str(p) for p in paths if p.exists()]
    if existing:
        raise ValueError(f'split_flex_index: {existing[0]} exists; remove it, or pass another folder')
    row_bytes = dims * 4
    with open(Path(index.index_path) / 'vecs.f4', 'rb') as source:
        for path, start, stop in zip(paths, bounds, bounds[1:]):
            tmp = path.with_name(f'.{path.name}.tmp')
            tmp.mkdir(parents=True, exist_ok=True)
            with open(tmp / 'vecs.f4', 'wb') as out:
                source.seek(start * row_bytes)
                for block in range(start, stop, SPLIT_BLOCK):
                    out.write(source.read((min(stop, block + SPLIT_BLOCK) - block) * row_bytes))
            npids.Lookup.build(iter(docnos.fwd[np.arange(start, stop)].tolist()), tmp / 'docnos.npids')
            (tmp / 'pt_meta.json').write_text(json.dumps({**meta, 'vec_size': dims, 'doc_count': stop - start}))
            os.replace(tmp, path)
    return [type(index)(str(path), sim_fn=index.sim_fn, verbose=index.verbose) for path in paths]
