"""Shared helpers of the benchmarks: environment, interleaved timing with min / median / spread, tables, machine
description, thread settings, and the cached synthetic corpus."""
import contextlib
import json
import os
import platform
import resource
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional

os.environ.setdefault('TQDM_DISABLE', '1')  # pyterrier-dr's scorer always draws a progress bar
os.environ.setdefault('HF_HUB_OFFLINE', '1')
for _var in ('IR_DATASETS_HOME', 'PYTERRIER_HOME'):  # pyterrier-pisa writes folders there on import
    os.environ.setdefault(_var, tempfile.mkdtemp(prefix=f'bench-rdime-{_var.lower()}-'))

import numpy as np  # noqa: E402

from pyterrier_rdime._config import default_cache_dir  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_COLLECTION = ROOT.parent / 'shared' / 'data' / 'msmarco-dl19-pool'
DEFAULT_CACHE = default_cache_dir() / 'benchmarks'


def log(*parts) -> None:
    print(*parts, flush=True)


def timed(fn: Callable):
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def interleaved(fns: Dict[str, Callable], rounds: int) -> Dict[str, List[float]]:
    """Run each function once per round, rotating the order each round (no side always runs first, after the same
    neighbour); returns name -> seconds of each round."""
    names = list(fns)
    times = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            times[n].append(timed(fns[n])[0])
    return times


def blocks(fns: Dict[str, Callable], rounds: int, per_block: int = 3) -> Dict[str, List[float]]:
    """Like :func:`interleaved`, but each function runs ``per_block`` times in a row per round and the round keeps
    the fastest of them: the first call of a block absorbs the switch from the other side (BLAS or OpenMP threads of
    the previous side still spinning, caches holding its data). OpenBLAS's workers may spin longer than a block of
    short calls lasts: ``switch`` measures what that costs."""
    names = list(fns)
    times = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            times[n].append(min(timed(fns[n])[0] for _ in range(per_block)))
    return times


def ratio_stats(base: List[float], new: List[float]) -> Dict[str, float]:
    """Speed-up of ``new`` over ``base`` from interleaved rounds: the ratio of the minima (the least disturbed
    round of each side), the median of the per-round ratios and their interquartile range (the spread)."""
    per_round = np.asarray(base) / np.asarray(new)
    return {'min': float(np.min(base) / np.min(new)), 'median': float(np.median(per_round)),
            'q1': float(np.quantile(per_round, 0.25)), 'q3': float(np.quantile(per_round, 0.75))}


def fmt_ratio(stats: Dict[str, float]) -> str:
    return f'{stats["min"]:.2f}× (median {stats["median"]:.2f}×, IQR {stats["q1"]:.2f}–{stats["q3"]:.2f})'


def table(rows, header) -> str:
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '|'.join('---' for _ in header) + '|']
    lines += ['| ' + ' | '.join(str(c) for c in row) + ' |' for row in rows]
    return '\n'.join(lines)


def max_rss_gib() -> float:
    """Peak resident memory of this process: VmHWM where /proc exists (ru_maxrss would also count the memory of the
    parent at fork time, which Linux carries across exec), else ru_maxrss."""
    try:
        with open('/proc/self/status') as f:
            for line in f:
                if line.startswith('VmHWM:'):
                    return int(line.split()[1]) / 2 ** 20
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20


def machine() -> dict:
    model = platform.processor()
    try:
        for line in open('/proc/cpuinfo'):
            if line.startswith('model name'):
                model = line.split(':', 1)[1].strip()
                break
    except OSError:
        pass
    memory = os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2 ** 30
    return {'cpu': model, 'cores': os.cpu_count(), 'memory': f'{memory:.0f} GiB', 'python': platform.python_version(),
            'numpy': np.__version__, 'load_average_at_start': os.getloadavg()}


def describe_machine(info: dict, threads: Optional[int]) -> str:
    used = f'{threads} thread(s) for BLAS and numba alike' if threads is not None else 'threads as each process sets'
    return (f'machine: {info["cpu"]}, {info["cores"]} cores, {info["memory"]}; Python {info["python"]}, numpy '
            f'{info["numpy"]}; {used}; load average at start '
            f'{", ".join(f"{x:.1f}" for x in info["load_average_at_start"])}')


def synthetic_index_options(parser) -> None:
    """The options of every benchmark over the synthetic index: its size, the threads of both sides, where it is
    cached, and a JSON copy of the measurements."""
    parser.add_argument('--docs', type=int, default=1_000_000, help='documents of the synthetic index')
    parser.add_argument('--dims', type=int, default=768)
    parser.add_argument('--threads', type=int, default=os.cpu_count(),
                        help='threads for BLAS and numba alike (default: every core)')
    parser.add_argument('--cache', type=Path, default=DEFAULT_CACHE,
                        help='where the synthetic index, its layout and the pool vectors are cached')
    parser.add_argument('--json', type=Path, help='also write the measurements here')


def set_threads(threads: int):
    """The same number of threads for BLAS (the dense path), numba (the pruned paths) and torch (the compressed one
    pass's int8 product); returns the BLAS limiter (keep it alive; ``.unregister()`` to undo)."""
    from threadpoolctl import threadpool_limits
    try:
        import numba
        numba.set_num_threads(threads)
    except ImportError:
        pass
    try:
        import torch
        torch.set_num_threads(threads)
    except ImportError:
        pass
    return threadpool_limits(threads, user_api='blas')


@contextlib.contextmanager
def session(args, threads: Optional[int], title: str = '', note: str = '') -> Iterator[Dict[str, object]]:
    """The set-up and tear-down of every benchmark's ``main``: logs ``title`` and the machine (with ``note``), limits
    BLAS and numba to ``threads`` (``None``: leaves them, for a benchmark that times child processes) for the block,
    then logs the load average at the end and, with ``--json``, writes the dict the block filled (yielded) with the
    machine and the options. The machine's description is ``results['machine']`` meanwhile, for a plot's label."""
    info = machine()
    limiter = set_threads(threads) if threads is not None else None
    if title:
        log(title)
    log(describe_machine(info, threads) + note)
    results: Dict[str, object] = {}
    try:
        yield {'machine': info, 'results': results}
    finally:
        if limiter is not None:
            limiter.unregister()
    log(f'\nload average at end: {", ".join(f"{x:.1f}" for x in os.getloadavg())}')
    if getattr(args, 'json', None):
        write_json(args.json, info, args, results)


def write_json(path: Path, info: dict, args, results: dict) -> None:
    info['load_average_at_end'] = os.getloadavg()
    path.write_text(json.dumps({'machine': info, 'args': {k: str(v) for k, v in vars(args).items()}, **results},
                               indent=1, default=float))


def synthetic_flex_index(cache: Path, docs: int, dims: int, seed: int = 42):
    """A FlexIndex of ``docs`` unit-norm float32 vectors shaped like sentence embeddings (a shared mean direction,
    per-dimension scales spread log-normally, documents clustered around topics of ~100), cached under ``cache``
    and written straight in the FlexIndex format, in chunks. Returns ``(index, generator state)``: the topic centres,
    mean and scales, to draw queries from the same distribution, and each document's topic (``topic_of``), to group
    documents as a clustered index would."""
    from pyterrier_dr import FlexIndex
    path = cache / f'synthetic-{docs}x{dims}-seed{seed}.flex'
    rng = np.random.default_rng(seed)
    scale = np.exp(0.5 * rng.standard_normal(dims)).astype(np.float32)
    scale /= np.sqrt(np.mean(scale ** 2))
    mean = (rng.standard_normal(dims) * scale).astype(np.float32)
    mean *= 0.6 / np.linalg.norm(mean)
    topics = max(1, docs // 100)
    centres = rng.standard_normal((topics, dims), dtype=np.float32) * scale
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    topic_of = rng.integers(0, topics, size=docs)  # drawn before the vectors: a cached index has the same topics
    state = {'centres': centres, 'mean': mean, 'scale': scale, 'topic_of': topic_of}
    if (path / 'pt_meta.json').is_file():
        return FlexIndex(str(path), verbose=False), state
    import npids
    tmp = path.with_name(path.name + '.tmp')
    tmp.mkdir(parents=True, exist_ok=True)
    with open(tmp / 'vecs.f4', 'wb') as out:
        for start in range(0, docs, 65536):
            end = min(docs, start + 65536)
            block = rng.standard_normal((end - start, dims), dtype=np.float32)
            block *= scale
            block *= 0.9 / np.linalg.norm(block, axis=1, keepdims=True)
            block += mean
            block += centres[topic_of[start:end]]
            block /= np.linalg.norm(block, axis=1, keepdims=True)
            out.write(block.tobytes())
    npids.Lookup.build((f'doc{i}' for i in range(docs)), tmp / 'docnos.npids')
    (tmp / 'pt_meta.json').write_text(json.dumps({'type': 'dense_index', 'format': 'flex', 'vec_size': dims,
                                                  'doc_count': docs}))
    os.replace(tmp, path)
    return FlexIndex(str(path), verbose=False), state
