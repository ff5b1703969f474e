"""``python -m pyterrier_rdime.pruned [--threads N]``: what :data:`DESCRIPTION` says, then where the model was saved
and what it predicts for one query over an index of a million 768-dimensional documents."""
import argparse
import contextlib
import sys
import time

import numpy as np

from . import calibration, planner
from .planner import CostModel

DESCRIPTION = ("Re-calibrates the cost model of PrunedRetriever(strategy='auto') on this machine (a few seconds) "
               'and caches it for this CPU model and thread counts; run it again when the first calibration ran on a '
               'busy machine.')
#: The index and search the printed predictions are for: 1M x 768 float32, top 100, one query.
EXAMPLE_DOCS, EXAMPLE_DIMS, EXAMPLE_K = 1_000_000, 768, 100


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
        chosen = planner.choose(query, strategy='auto', matrix_bytes=matrix_bytes, compiled=True,
                                model=lambda: fitted, k=EXAMPLE_K).path
        lines.append(f'  {kept:.0%} of the dimensions kept: pruned {costs["pruned"]:.2f}x, compressed '
                     f'{costs["compressed"]:.2f}x -> strategy=\'auto\' takes {chosen}')
    return '\n'.join(lines)


def main(argv=None) -> int:
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
        fitted = calibration.calibrate(verbose=True)
        print(summary(fitted, str(calibration.cache_path()), time.perf_counter() - start))
    return 0


if __name__ == '__main__':
    sys.exit(main())
