"""The cost model behind ``PrunedRetriever(strategy='auto')``: the estimated time of each scoring path, in units of
one dense ``gemv`` over the whole matrix (one query, every dimension, top-k included), from the fraction of
dimensions each query keeps. Its six constants are calibrated on the machine in use, not fitted once on another CPU:
:func:`calibrate` times both paths on a synthetic matrix several times the size of the CPU caches (a few seconds),
and the result is cached per CPU model and thread count in ``default_cache_dir()/cost``; :func:`model` loads it, or
calibrates on first use. Re-run it on demand with ``python -m pyterrier_rdime.pruned.cost``."""
import dataclasses
import functools
import json
import logging
import os
import platform
import re
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np

from .._config import default_cache_dir
from .dense import GEMV_BELOW

#: Below this matrix size (bytes) the matrix sits in the CPU caches, scoring is not memory-bound, and BLAS (tuned
#: for compute) is at least as fast as the compiled kernel: ``'auto'`` scores densely.
MIN_PRUNED_BYTES = 16 * 2 ** 20
#: ``'auto'`` takes the pruned path only when its estimate is below this fraction of the dense one: a margin for the
#: model's error near the break-even, where either path costs about the same.
MARGIN = 0.95
#: The calibration matrix: ``CALIBRATION_DIMS x CALIBRATION_DOCS`` float32 (192 MiB, six times a 32 MiB L3 cache),
#: so that both paths stream it from memory, as they do a real index.
CALIBRATION_DIMS, CALIBRATION_DOCS = 768, 65536
#: Repetitions of each timing per pass of a calibration (the minimum over both passes is kept: the least
#: disturbed by other processes).
CALIBRATION_ROUNDS = 3

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Estimated cost of each path in units of one dense ``gemv`` with top-k over the same matrix.

    - dense: fewer than ``GEMV_BELOW`` queries cost 1 each (one ``gemv`` each); from there one matrix product per
      batch costs ``dense_gemm_fixed + dense_gemm_per_query * queries``;
    - pruned, one query at a time (memory-bound: the kept rows are streamed once):
      ``pruned_fixed + pruned_slope * kept fraction`` per query;
    - pruned, a batch in one pass (the union of the kept rows is read once, every query's kept rows are re-read from
      the cache): ``batch_union * union fraction + batch_per_query * sum of kept fractions``.
    """
    dense_gemm_fixed: float
    dense_gemm_per_query: float
    pruned_fixed: float
    pruned_slope: float
    batch_union: float
    batch_per_query: float

    def dense_cost(self, queries: int) -> float:
        """Estimated cost of scoring ``queries`` queries on the dense path."""
        if queries < GEMV_BELOW:
            return float(queries)
        return self.dense_gemm_fixed + self.dense_gemm_per_query * queries

    def pruned_one_by_one_cost(self, query_vecs: np.ndarray) -> float:
        """Estimated cost of the pruned path one query at a time."""
        return float(np.sum(self.pruned_fixed + self.pruned_slope * nonzero_fractions(query_vecs)))

    def pruned_batch_cost(self, query_vecs: np.ndarray) -> float:
        """Estimated cost of the pruned path for the whole batch in one pass."""
        union = float(np.mean((query_vecs != 0).any(axis=0))) if len(query_vecs) else 0.0
        return self.batch_union * union + self.batch_per_query * float(np.sum(nonzero_fractions(query_vecs)))

    def batch_in_one_pass(self, query_vecs: np.ndarray) -> bool:
        """Whether the pruned path should score these queries in one pass rather than one by one."""
        return len(query_vecs) > 1 and self.pruned_batch_cost(query_vecs) < self.pruned_one_by_one_cost(query_vecs)

    def pruned_cost(self, query_vecs: np.ndarray) -> float:
        """Estimated cost of the pruned path (the cheaper of one by one and one pass)."""
        return min(self.pruned_one_by_one_cost(query_vecs), self.pruned_batch_cost(query_vecs))

    def prefers_pruned(self, query_vecs: np.ndarray) -> bool:
        """Whether the pruned path is estimated cheaper than ``MARGIN`` times the dense one for these queries."""
        return self.pruned_cost(query_vecs) < MARGIN * self.dense_cost(len(query_vecs))


def nonzero_fractions(query_vecs: np.ndarray) -> np.ndarray:
    """The fraction of non-zero dimensions of each query vector (n, dims)."""
    return np.mean(query_vecs != 0, axis=1)


def choose_path(query_vecs: np.ndarray, matrix_bytes: int, compiled: bool) -> str:
    """``'pruned'`` or ``'dense'``: the path ``strategy='auto'`` takes for these pruned query vectors (n, dims) over
    a matrix of ``matrix_bytes``; always ``'dense'`` without the compiled kernel (the numpy fallback of the pruned
    path is slower than BLAS beyond ~30 % kept) and for a matrix under ``MIN_PRUNED_BYTES``; else by :func:`model`
    (calibrated on first use)."""
    if not compiled or matrix_bytes < MIN_PRUNED_BYTES or not len(query_vecs):
        return 'dense'
    return 'pruned' if model().prefers_pruned(query_vecs) else 'dense'


_MODELS: Dict[str, CostModel] = {}


@functools.lru_cache(maxsize=1)
def _cpu() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open('/proc/cpuinfo') as f:
            cpu = next((line.split(':', 1)[1] for line in f if line.startswith('model name')), cpu)
    except OSError:
        pass
    slug = re.sub(r'[^A-Za-z0-9]+', '-', cpu).strip('-').lower() or 'cpu'
    return f'{slug}-{os.cpu_count()}cpus'


def machine_key() -> str:
    """The CPU model and the numba thread count (which the process may change), as a file name: a calibration holds
    for these only."""
    import numba
    return f'{_cpu()}-{numba.get_num_threads()}threads'


def cache_path(key: Optional[str] = None) -> Path:
    """Where the calibration of this machine (or of ``key``) is cached."""
    return default_cache_dir() / 'cost' / f'{key or machine_key()}.json'


def model() -> CostModel:
    """The cost model of this machine and thread count: from this process's memory, else the cache file, else
    calibrated now (a few seconds, once per CPU model and thread count) and cached."""
    key = machine_key()
    if key not in _MODELS:
        path = cache_path(key)
        try:
            _MODELS[key] = CostModel(**json.loads(path.read_text())['model'])
        except (OSError, ValueError, KeyError, TypeError):
            _log.info('calibrating the cost model of PrunedRetriever(strategy="auto") for %s (once: cached in %s)',
                      key, path)
            _MODELS[key] = calibrate()
    return _MODELS[key]


def calibrate(*, save: bool = True, rounds: int = CALIBRATION_ROUNDS, docs: int = CALIBRATION_DOCS) -> CostModel:
    """Times the dense and the pruned paths on a ``CALIBRATION_DIMS x docs`` synthetic matrix with top-100, each
    timing ``2 x rounds`` times in blocks (the minimum kept), and solves for the model's constants:
    the dense matrix product from batches of 8 and 64; the pruned path one query at a time from kept fractions of
    0.2 and 0.8; one pass from batches of 8 and 64 with independent kept sets (union ~1) and of 8 sharing one kept
    set (union = kept), by least squares. With ``save``, cached for :func:`model` (and replaces its entry)."""
    from . import _numba
    from .dense import search_dense
    rng = np.random.default_rng(0)
    matrix = rng.random((CALIBRATION_DIMS, docs), dtype=np.float32)
    matrix -= 0.5

    def queries(n: int, kept: float, shared: bool = False) -> np.ndarray:
        q = rng.standard_normal((n, CALIBRATION_DIMS)).astype(np.float32)
        mask = rng.random((1 if shared else n, CALIBRATION_DIMS)) < kept
        return np.where(mask, q, 0).astype(np.float32)

    batch = {(8, 'indep'): queries(8, 0.35), (64, 'indep'): queries(64, 0.35), (8, 'shared'): queries(8, 0.35, True)}
    single = {kept: queries(1, kept) for kept in (0.2, 0.8)}
    full = queries(64, 1.0)
    fns: Dict[str, Callable] = {
        'gemv': lambda: search_dense(matrix, full[:1], 100),
        'gemm 8': lambda: search_dense(matrix, full[:8], 100),
        'gemm 64': lambda: search_dense(matrix, full, 100),
        **{f'one {kept}': (lambda q=q: _numba.fused_top_k(matrix, q, 100, one_pass=True))
           for kept, q in single.items()},
        **{f'pass {n} {kind}': (lambda q=q: _numba.fused_top_k(matrix, q, 100, one_pass=True))
           for (n, kind), q in batch.items()},
    }
    for fn in fns.values():  # compile (or load) the kernels, touch the matrix
        fn()
    # in blocks (each timing ``rounds`` times in a row, so that the previous one's threads have stopped spinning),
    # in two passes in opposite orders (a burst of load from other processes does not hit one timing alone)
    times: Dict[str, List[float]] = {name: [] for name in fns}
    for names in (list(fns), list(fns)[::-1]):
        for name in names:
            for _ in range(rounds):
                start = time.perf_counter()
                fns[name]()
                times[name].append(time.perf_counter() - start)
    unit = min(times['gemv'])
    t = {name: min(values) / unit for name, values in times.items()}
    gemm_per = (t['gemm 64'] - t['gemm 8']) / 56
    slope = (t['one 0.8'] - t['one 0.2']) / (nonzero_fractions(single[0.8])[0] - nonzero_fractions(single[0.2])[0])
    rows, costs = [], []
    for (n, kind), q in batch.items():
        rows.append([float(np.mean((q != 0).any(axis=0))), float(np.sum(nonzero_fractions(q)))])
        costs.append(t[f'pass {n} {kind}'])
    union, per_query = np.linalg.lstsq(np.array(rows), np.array(costs), rcond=None)[0]
    # a fixed cost that noise pushed below 0 is 0: every path costs at least what it reads
    fitted = CostModel(dense_gemm_fixed=max(0.0, float(t['gemm 8'] - 8 * gemm_per)),
                       dense_gemm_per_query=float(gemm_per),
                       pruned_fixed=max(0.0, float(t['one 0.2'] - slope * nonzero_fractions(single[0.2])[0])),
                       pruned_slope=float(slope), batch_union=max(0.0, float(union)),
                       batch_per_query=float(per_query))
    if save:
        key = machine_key()
        path = cache_path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {'machine': key, 'calibrated_at': time.strftime('%Y-%m-%d %H:%M:%S'), 'unit_gemv_s': unit,
                  'load_average': os.getloadavg(), 'timings_in_gemv': t, 'model': dataclasses.asdict(fitted)}
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f'.{path.name}.', suffix='.tmp')
        with os.fdopen(fd, 'w') as out:
            json.dump(record, out, indent=1)
        os.replace(tmp, path)
        _MODELS[key] = fitted
    return fitted


if __name__ == '__main__':
    calibrated = calibrate()
    print(f'{cache_path()}:', json.dumps(dataclasses.asdict(calibrated), indent=1))
