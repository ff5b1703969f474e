"""``python -m pyterrier_rdime.pruned [--threads N]``: re-calibrates the cost model of
``PrunedRetriever(strategy='auto')`` on this machine (a few seconds) and caches it for this CPU model and thread
counts; run it again when the first calibration ran on a busy machine."""
import argparse
import contextlib
import dataclasses
import json
import sys

from . import calibration


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog='python -m pyterrier_rdime.pruned', description=__doc__.split(';')[0])
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
        fitted = calibration.calibrate()
        print(f'{calibration.cache_path()}:', json.dumps(dataclasses.asdict(fitted), indent=1))
    return 0


if __name__ == '__main__':
    sys.exit(main())
