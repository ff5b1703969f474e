"""The rehearsal's collection-scale FlexIndex (``scale``): a real core (a collection's passages, encoded once by
:mod:`scale_core`) spread evenly among synthetic distractors, up to MS MARCO's 8,841,823 passages.

The distractors are drawn from a Gaussian with the core vectors' mean and covariance, then unit-normalised as
mpnet and MiniLM normalise their own vectors. Why this one: it matches the first two moments of real passage vectors
in every direction, so the dimensions' variances (which the variance control orders by), the spread of the scores
``q . d`` and the correlations between dimensions that DIME's importance reads are those of real passages; a query
finds, among millions of such draws, distractors scoring about as high as its real top-10 (measured on 4,608 DL19
pool passages with mpnet: the best of 8.8M draws scores ~0.53 for the median query, its 10th best real passage
~0.64), so they crowd its top-1000 without being relevant. What it lacks: topical clusters and near-duplicates of
relevant passages (real MS MARCO has many), which would make the task harder still. Perturbed mixtures of real
vectors were the alternative; with 14.6k real vectors, a mixture of few of them repeats their topics millions of
times, a stronger and less realistic bias.

Built once, a block of documents at a time (each block drawn from its own seed, so a killed build resumes at the
first unwritten block and writes the same bytes), into the FlexIndex layout pyterrier-dr reads (``vecs.f4``,
``docnos.npids``, and ``pt_meta.json`` last, so that a half-built folder is never taken for an index).
"""
import json
import os
from pathlib import Path
from typing import List

import numpy as np

#: Documents per generated block (``block x dims x 4`` bytes: 192 MiB at 768 dimensions).
BLOCK = 65536
#: Distractors' docnos: ``syn`` and the docid (no collision with MS MARCO's numeric docnos).
SYNTHETIC_PREFIX = 'syn'


def core_positions(docs: int, core: int) -> np.ndarray:
    """The docids of the real passages: evenly spread over the index (a real passage in every stretch of it)."""
    if core > docs:
        raise ValueError(f'--docs {docs} is smaller than the real core ({core} passages); pass --docs {core} or more')
    return np.round(np.linspace(0, docs - 1, core)).astype(np.int64)


def build_index(folder: Path, core_docnos: List[str], core_vecs: np.ndarray, docs: int, seed: int = 0,
                verbose: bool = True) -> Path:
    """The FlexIndex at ``folder`` (built, or resumed, or returned as it is when complete and made from the same
    inputs): ``docs`` documents, the core at :func:`core_positions`, distractors elsewhere."""
    folder = Path(folder)
    core_vecs = np.asarray(core_vecs, dtype=np.float32)
    dims = core_vecs.shape[1]
    spec = {'docs': docs, 'dims': dims, 'core': len(core_docnos), 'seed': seed, 'block': BLOCK,
            'core_sum': float(np.sum(core_vecs, dtype=np.float64)), 'distribution': 'gaussian(core mean, core cov)'}
    progress_path = folder / 'scale_build.json'
    if (folder / 'pt_meta.json').is_file() and _read(progress_path).get('spec') == spec:
        return folder
    state = _read(progress_path)
    done = state.get('blocks_done', 0) if state.get('spec') == spec else 0
    folder.mkdir(parents=True, exist_ok=True)
    (folder / 'pt_meta.json').unlink(missing_ok=True)
    vecs_path = folder / 'vecs.f4'
    if done == 0 or not vecs_path.is_file():
        done = 0
        with open(vecs_path, 'wb') as f:
            f.truncate(docs * dims * 4)
    positions = core_positions(docs, len(core_docnos))
    mean = core_vecs.astype(np.float64).mean(axis=0)
    # a small ridge: 14.6k vectors of a model that uses every direction give a full-rank covariance, but rounding
    # may leave it a hair from positive definite
    cholesky = np.linalg.cholesky(np.cov(core_vecs.T.astype(np.float64)) + 1e-8 * np.eye(dims)).astype(np.float32)
    blocks = range(0, docs, BLOCK)
    from tqdm import tqdm
    with open(vecs_path, 'r+b') as out, tqdm(total=docs, initial=min(docs, done * BLOCK), unit='doc',
                                             desc=f'building {folder.name}', disable=not verbose) as bar:
        for number, start in enumerate(blocks):
            if number < done:
                continue
            stop = min(docs, start + BLOCK)
            rows = np.random.default_rng([seed, number]).standard_normal((stop - start, dims), dtype=np.float32)
            rows = rows @ cholesky.T
            rows += mean.astype(np.float32)
            rows /= np.linalg.norm(rows, axis=1, keepdims=True)
            inside = np.flatnonzero((positions >= start) & (positions < stop))
            rows[positions[inside] - start] = core_vecs[inside]
            os.pwrite(out.fileno(), rows.tobytes(), start * dims * 4)
            _write(progress_path, {'spec': spec, 'blocks_done': number + 1})
            bar.update(stop - start)
        out.flush()
        os.fsync(out.fileno())
    from npids import Lookup
    (folder / 'docnos.npids').unlink(missing_ok=True)
    names = np.array([f'{SYNTHETIC_PREFIX}{i}' for i in range(docs)], dtype=object)
    names[positions] = core_docnos
    Lookup.build(iter(names), folder / 'docnos.npids')
    _write(folder / 'pt_meta.json', {'type': 'dense_index', 'format': 'flex', 'vec_size': dims, 'doc_count': docs})
    _write(progress_path, {'spec': spec, 'blocks_done': len(blocks)})
    return folder


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _write(path: Path, record: dict) -> None:
    tmp = path.with_suffix('.tmp')
    tmp.write_text(json.dumps(record))
    tmp.replace(path)
