"""The calibration of the cost model behind ``strategy='auto'`` (pt_docs/speed.rst): :func:`calibrate` times the
paths on a synthetic matrix larger than the CPU caches and fits :class:`.planner.CostModel`, cached per CPU model and
thread counts (:func:`machine_key`, which also keys the measured timings); :func:`model` loads it. ``python -m
pyterrier_rdime.pruned`` (:func:`main`) re-runs it and prints what it predicts (:func:`summary`)."""
import argparse
import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import os
import platform
import re
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np
import pyterrier as pt

from .. import store
from .._config import cpu_info, default_cache_dir
from . import compressed, dense, layout
from .planner import RESCORED_PER_RESULT, CostModel, batch_features, choose, nonzero_fractions, one_pass_rows

#: The calibration matrix, float32: 192 MiB, streamed from memory (six times a 32 MiB L3) as a real index is.
CALIBRATION_DIMS, CALIBRATION_DOCS = 768, 65536
#: The matrix on which the compressed path's own work per call is timed: as many documents as the top-k needs.
CALLS_DOCS = 256
#: Results per query of every timing (``k``).
CALIBRATION_K = 100
#: Repetitions of each timing per pass (the minimum over both passes is kept).
CALIBRATION_ROUNDS = 3
#: A fit that misses one of its own timings by more than this (relative) is kept with a warning.
FIT_TOLERANCE = 0.25
DESCRIPTION = ("Re-calibrates the cost model of PrunedRetriever(strategy='auto') on this machine (a few seconds) "
               'and caches it for this CPU model and thread counts; run it again when the first calibration ran on a '
               'busy machine.')
#: The index and search the printed predictions are for: 1M x 768 float32, top 100, one query.
EXAMPLE_DOCS, EXAMPLE_DIMS, EXAMPLE_K = 1_000_000, 768, 100

_log = logging.getLogger(__name__)


def fit_non_negative(features: np.ndarray, costs: np.ndarray) -> np.ndarray:
    """The coefficients ``c >= 0`` minimising the relative error of ``features @ c`` against ``costs``: exact
    non-negative least squares by trying every subset of the few columns."""
    weighted = features / costs[:, None]
    best, best_error = np.zeros(features.shape[1]), np.inf
    for mask in range(1, 2 ** features.shape[1]):
        cols = [c for c in range(features.shape[1]) if mask >> c & 1]
        coef = np.linalg.lstsq(weighted[:, cols], np.ones(len(costs)), rcond=None)[0]
        error = float(np.sum((weighted[:, cols] @ coef - 1) ** 2))
        if np.all(coef >= 0) and error < best_error:
            best, best_error = np.zeros(features.shape[1]), error
            best[cols] = coef
    return best


_MODELS: Dict[str, CostModel] = {}
#: A model of zeros, for the parts of a fit that need only some constants.
_ZERO = CostModel(**{field.name: 0.0 for field in dataclasses.fields(CostModel)})


@functools.lru_cache(maxsize=1)
def _cpu() -> str:
    """The CPU as a file name: model name, family and model (one name can cover generations: AMD EPYC Zen 3 without
    AVX-512, Zen 4 with it), its widest vector or int8 instructions and its cores."""
    info = cpu_info()
    slug = re.sub(r'[^A-Za-z0-9]+', '-', info.get('model name') or platform.processor() or platform.machine())
    generation = f'-{info["cpu family"]}-{info["model"]}' if 'cpu family' in info and 'model' in info else ''
    flags = set(info.get('flags', '').split())
    isa = next((flag for flag in ('amx_int8', 'avx512_vnni', 'avx512f', 'avx2') if flag in flags), 'base')
    return f'{slug.strip("-").lower() or "cpu"}{generation}-{isa.replace("_", "")}-{os.cpu_count()}cpus'


@functools.lru_cache(maxsize=1)
def _blas():
    """numpy's BLAS by threadpoolctl (None without it): the one in numpy's wheel, else every BLAS loaded."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    blas = ThreadpoolController().select(user_api='blas')
    numpy_own = [info['filepath'] for info in blas.info() if Path(info['filepath']).parent.name.startswith('numpy')]
    return blas.select(filepath=numpy_own) if numpy_own else blas


#: The paths' generation: raised with a change that moves their speeds, so that no calibration or measured timing of
#: the older code is read (2: the one pass's growing buffers, compiled re-scoring, longer nested blocks; 3: its
#: top-k re-selected once per slab, re-scoring in docid order).
KERNELS = 3


def machine_key() -> str:
    """The CPU model, :data:`KERNELS` and numba's and numpy's BLAS thread counts, as a file name: a calibration holds
    for these only (``unknown`` BLAS threads without threadpoolctl)."""
    import numba
    blas = _blas()
    counts = sorted({library['num_threads'] for library in blas.info()}) if blas is not None else []
    return f'{_cpu()}-k{KERNELS}-{numba.get_num_threads()}threads-blas{"-".join(map(str, counts)) or "unknown"}'


def cache_path(key: Optional[str] = None) -> Path:
    """Where the calibration of this machine (or of ``key``) is cached."""
    return default_cache_dir() / 'cost' / f'{key or machine_key()}.json'


def record_path(vecs: Path) -> Path:
    """Where :class:`.planner.MeasuredChoice` keeps the timings of the FlexIndex with vectors ``vecs``, under
    ``default_cache_dir()/cost/measured``: keyed by machine and the file's identity."""
    identity = json.dumps({'path': str(vecs.resolve()), **store.stat_fields(vecs)}, sort_keys=True)
    digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
    return default_cache_dir() / 'cost' / 'measured' / f'{machine_key()}-{vecs.parent.name}-{digest}.json'


def model(*, verbose: bool = False) -> CostModel:
    """The cost model of this machine and thread counts: from memory, else the cache file, else calibrated now (a few
    seconds, a progress bar when ``verbose``)."""
    key = machine_key()
    if key not in _MODELS:
        path = cache_path(key)
        try:
            _MODELS[key] = CostModel(**json.loads(path.read_text())['model'])
        except (OSError, ValueError, KeyError, TypeError):
            _log.info('calibrating the cost model of PrunedRetriever(strategy="auto") for %s (once: cached in %s)',
                      key, path)
            _MODELS[key] = calibrate(verbose=verbose)
    return _MODELS[key]


def calibrate(*, save: bool = True, rounds: int = CALIBRATION_ROUNDS, docs: int = CALIBRATION_DOCS,
              verbose: bool = False) -> CostModel:
    """Times the dense, pruned and compressed paths (single queries at 20, 50 and 80 % kept, batches of 8 and 64) on
    a ``CALIBRATION_DIMS x docs`` synthetic matrix, each ``2 x rounds`` times (the minimum kept), and fits the
    model's constants by :func:`fit_non_negative`, in units of one ``gemv``. The compressed path's re-scoring and
    per-call work are timed apart, its scan is the rest. With ``save``, cached for :func:`model`; a fit that misses
    a timing by more than ``FIT_TOLERANCE`` logs a warning."""
    from . import _numba  # numba loads only when the kernel first runs, or now
    rng = np.random.default_rng(0)
    matrix = rng.random((CALIBRATION_DIMS, docs), dtype=np.float32)
    matrix -= 0.5
    copy = layout.quantise(matrix)
    rows = np.ascontiguousarray(matrix.T)  # the rows the compressed path re-scores from
    tiny = np.ascontiguousarray(matrix[:, :CALLS_DOCS])
    tiny_copy, one_dim = layout.quantise(tiny), np.eye(1, CALIBRATION_DIMS, dtype=np.float32)
    rescored = np.sort(rng.choice(docs, min(docs, round(RESCORED_PER_RESULT * CALIBRATION_K)), replace=False))

    def queries(n: int, kept: float, shared: bool = False) -> np.ndarray:
        q = rng.standard_normal((n, CALIBRATION_DIMS)).astype(np.float32)
        mask = rng.random((1 if shared else n, CALIBRATION_DIMS)) < kept
        return np.where(mask, q, 0).astype(np.float32)

    single = {kept: queries(1, kept) for kept in (0.2, 0.5, 0.8)}
    batch = {f'pass {n} {kept} {"shared" if shared else "independent"}': queries(n, kept, shared)
             for n in (8, 64) for kept in (0.25, 0.5, 0.75) for shared in (False, True)}
    full = queries(64, 1.0)
    compressed_batch = {n: queries(n, 0.35) for n in (8, 64)}
    trees = {n: dense.nested_trees(q) for n, q in compressed_batch.items()}
    pass_weights = {n: compressed.one_pass_weights(copy, q, trees[n][0]) for n, q in compressed_batch.items()}
    fns: Dict[str, Callable] = {
        **{name: (lambda n=n: dense.search_dense(matrix, full[:n], CALIBRATION_K))
           for name, n in (('gemv', 1), ('gemm 8', 8), ('gemm 64', 64))},
        **{name: (lambda q=q: _numba.fused_top_k(matrix, q, CALIBRATION_K, one_pass=True))
           for name, q in [*((f'one {kept}', q) for kept, q in single.items()), *batch.items()]},
        **{f'compressed {kept}': (lambda q=q: compressed.search_compressed(copy, matrix, q, CALIBRATION_K,
                                                                          use_numba=True, doc_rows=rows))
           for kept, q in single.items()},
        **{f'rescore {kept}': (lambda q=q: compressed.exact_scores(matrix, q, [rescored], rows, use_numba=True))
           for kept, q in single.items()},
        'compressed call': lambda: compressed.search_compressed(tiny_copy, tiny, one_dim, CALIBRATION_K,
                                                                use_numba=True, doc_rows=rows[:CALLS_DOCS]),
        **{f'compressed pass {n}': (lambda q=q: compressed.search_compressed(copy, matrix, q, CALIBRATION_K,
                                                                             use_numba=True, one_pass=True,
                                                                             doc_rows=rows))
           for n, q in compressed_batch.items()},
        **{f'compressed first pass {n}': (lambda w=w, n=n: compressed.integer_candidates(
            copy.codes, w[1], w[3], CALIBRATION_K, nested=trees[n][1:]))
           for n, w in pass_weights.items()},
    }
    with pt.tqdm(total=len(fns) * (1 + 2 * rounds), desc='PrunedRetriever calibration', unit='timing',
                 disable=not verbose) as progress:
        for fn in fns.values():  # compile (or load) the kernels, touch the matrix
            fn()
            progress.update()
        # in blocks (the previous timing's threads have stopped spinning), two passes in opposite orders (a burst of
        # load does not hit one timing alone)
        times: Dict[str, List[float]] = {name: [] for name in fns}
        for names in (list(fns), list(fns)[::-1]):
            for name in names:
                for _ in range(rounds):
                    start = time.perf_counter()
                    fns[name]()
                    times[name].append(time.perf_counter() - start)
                progress.update(rounds)
    unit = min(times['gemv'])
    t = {name: min(values) / unit for name, values in times.items()}
    dense_fit = fit_non_negative(np.array([[1.0, 8.0], [1.0, 64.0]]), np.array([t['gemm 8'], t['gemm 64']]))
    kept_fractions = np.array([nonzero_fractions(q)[0] for q in single.values()])
    per_kept = np.stack([np.ones(3), kept_fractions], axis=1)
    single_fit = fit_non_negative(per_kept, np.array([t[f'one {kept}'] for kept in single]))
    batch_fit = fit_non_negative(np.array([batch_features(q) for q in batch.values()]),
                                 np.array([t[name] for name in batch]))
    rescored_values = len(rescored) * kept_fractions * CALIBRATION_DIMS
    rescore_seconds = fit_non_negative(rescored_values[:, None],
                                       np.array([t[f'rescore {kept}'] * unit for kept in single]))[0]
    call_seconds = t['compressed call'] * unit
    # the scan: the compressed path's time less the call's own work and the re-scoring
    scan = np.array([t[f'compressed {kept}'] for kept in single])
    scan -= (call_seconds + rescore_seconds * rescored_values) / unit
    scan_fit = fit_non_negative(per_kept, np.maximum(scan, 1e-3))
    # the first pass is timed with the pass's own nesting, so its unit is a row of the int8 product (one_pass_rows)
    pass_rows = np.array([one_pass_rows(q) for q in compressed_batch.values()])
    pass_fit = fit_non_negative(np.stack([np.ones(len(pass_rows)), pass_rows], axis=1),
                                np.array([t[f'compressed first pass {n}'] for n in compressed_batch]))
    rescore_only = dataclasses.replace(_ZERO, rescore_seconds=rescore_seconds)
    sizes = np.array(list(compressed_batch), dtype=float)
    pass_rest = [(t[f'compressed pass {n}'] - pass_fit[0] - pass_fit[1] * rows) * unit
                 - rescore_only.compressed_seconds(q, CALIBRATION_K, 0.0)
                 for (n, q), rows in zip(compressed_batch.items(), pass_rows)]
    pass_call_seconds = max(0.0, float(np.sum(pass_rest) / np.sum(sizes)))
    # the constants in the order of CostModel's fields
    fitted = CostModel(*map(float, [*dense_fit, *single_fit, *batch_fit, *scan_fit, call_seconds, *pass_fit,
                                    pass_call_seconds, rescore_seconds, unit / matrix.nbytes]))
    estimates = {**{f'one {kept}': fitted.pruned_one_by_one_cost(q) for kept, q in single.items()},
                 **{name: fitted.pruned_batch_cost(q) for name, q in batch.items()},
                 **{f'compressed {kept}': fitted.compressed_cost(q, CALIBRATION_K, matrix.nbytes)
                    for kept, q in single.items()},
                 **{f'compressed pass {n}': fitted.compressed_one_pass_cost(q, CALIBRATION_K, matrix.nbytes)
                    for n, q in compressed_batch.items()}}
    errors = {name: abs(estimate / t[name] - 1) for name, estimate in estimates.items()}
    worst = max(errors, key=errors.get)
    if errors[worst] > FIT_TOLERANCE:
        _log.warning('the cost model of PrunedRetriever(strategy="auto") misses the timing of "%s" by %.0f %% (load '
                     'average %.1f): re-run the calibration on a quieter machine with python -m '
                     'pyterrier_rdime.pruned', worst, errors[worst] * 100, os.getloadavg()[0])
    if save:
        key = machine_key()
        path = cache_path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {'machine': key, 'calibrated_at': time.strftime('%Y-%m-%d %H:%M:%S'), 'unit_gemv_s': unit,
                  'load_average': os.getloadavg(), 'timings_in_gemv': t, 'fit_relative_errors': errors,
                  'model': dataclasses.asdict(fitted)}
        with store.atomic_open(path) as out:
            json.dump(record, out, indent=1)
        _MODELS[key] = fitted
    return fitted


def summary(fitted: CostModel, path: str, seconds: float) -> str:
    """A calibration in words: where it was saved, a dense search's time over the example index, and each path's
    relative cost at 25, 50 and 75 % of the dimensions kept."""
    matrix_bytes = EXAMPLE_DOCS * EXAMPLE_DIMS * 4
    lines = [f"Calibrated the cost model of PrunedRetriever(strategy='auto') in {seconds:.0f} s; saved to {path}",
             '(read by every process on this machine with these thread counts; run this command again to replace it).',
             f'What it predicts here for one query over {EXAMPLE_DOCS:,} documents x {EXAMPLE_DIMS} dimensions '
             f'(float32, {matrix_bytes / 2 ** 30:.1f} GiB), top {EXAMPLE_K}: a dense search takes about '
             f'{fitted.gemv_seconds_per_byte * matrix_bytes * 1e3:.0f} ms, and, relative to it,']
    for kept in (0.25, 0.5, 0.75):
        query = np.zeros((1, EXAMPLE_DIMS), dtype=np.float32)
        query[0, :round(kept * EXAMPLE_DIMS)] = 1
        costs = fitted.path_costs(query, k=EXAMPLE_K, matrix_bytes=matrix_bytes, one_pass=False)
        chosen = choose(query, strategy='auto', matrix_bytes=matrix_bytes, compiled=True,
                        model=lambda: fitted, k=EXAMPLE_K).path
        lines.append(f'  {kept:.0%} of the dimensions kept: pruned {costs["pruned"]:.2f}x, compressed '
                     f'{costs["compressed"]:.2f}x -> strategy=\'auto\' takes {chosen}')
    return '\n'.join(lines)


def main(argv=None) -> int:
    """``python -m pyterrier_rdime.pruned [--threads N]``: what :data:`DESCRIPTION` says, then :func:`summary`."""
    parser = argparse.ArgumentParser(prog='python -m pyterrier_rdime.pruned', description=DESCRIPTION)
    parser.add_argument('--threads', type=int, help='threads of the compiled kernel and of BLAS to calibrate for '
                                                    '(default: every core numba may use; the cost model is cached per '
                                                    'thread count)')
    args = parser.parse_args(argv)
    try:
        import numba
    except ImportError:
        parser.error("the pruned path's compiled kernel needs numba, without which strategy='auto' always scores "
                     "densely and needs no calibration: pip install 'pyterrier-rdime[fast]' (from a clone: "
                     "pip install '.[fast]')")
    limits = contextlib.nullcontext()
    if args.threads is not None:
        if not 1 <= args.threads <= numba.config.NUMBA_NUM_THREADS:
            parser.error(f'--threads must be between 1 and {numba.config.NUMBA_NUM_THREADS}, got {args.threads}')
        try:  # the dense path must run on as many threads as the kernel, as in a process limited to N threads
            from threadpoolctl import threadpool_limits
        except ImportError:
            parser.error('--threads also limits the BLAS threads, which needs threadpoolctl (pip install '
                         'threadpoolctl); or run: OMP_NUM_THREADS=N NUMBA_NUM_THREADS=N python -m '
                         'pyterrier_rdime.pruned')
        numba.set_num_threads(args.threads)
        limits = threadpool_limits(args.threads, user_api='blas')
    with limits:  # the cache file is named after the thread counts in force
        start = time.perf_counter()
        fitted = calibrate(verbose=True)
        print(summary(fitted, str(cache_path()), time.perf_counter() - start))
    return 0
