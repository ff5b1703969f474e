"""benchmarks/auto.py at a tiny size, end to end: every row printed with auto's path, its ratio to the fastest path
and auto's top-k checked against the dense path, with and without the measured choice (no timed assertion: the
ratios depend on the machine)."""
import sys
from pathlib import Path

import pytest

# before the benchmark's common module sets TQDM_DISABLE for its own runs: tqdm reads its TQDM_* defaults when its
# classes are made, so a tqdm.auto first imported after that would hide every later test's progress bars
import tqdm.auto  # noqa: F401

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / 'benchmarks'))
import auto  # noqa: E402

from pyterrier_rdime.pruned import calibration, kept, planner  # noqa: E402

#: Round constants (tests/test_pruned_cost.py's): the compressed path cheapest, the others within reach.
MODEL = planner.CostModel(dense_gemm_fixed=2.0, dense_gemm_per_query=0.1, pruned_fixed=0.1, pruned_slope=1.0,
                          batch_per_query=0.05, batch_union=2.0, batch_per_kept=0.2, compressed_fixed=0.05,
                          compressed_slope=0.25, compressed_call_seconds=2e-3, compressed_pass_fixed=1.0,
                          compressed_pass_per_query=0.05, compressed_pass_call_seconds=1e-3, rescore_seconds=1e-3,
                          gemv_seconds_per_byte=1e-6)


@pytest.mark.skipif(not kept.NUMBA_AVAILABLE, reason='the pruned paths need numba')
@pytest.mark.parametrize('measured', [True, False])
def test_the_auto_benchmark_runs_every_row(tmp_path, monkeypatch, capsys, measured):
    monkeypatch.setenv('PYTERRIER_RDIME_CACHE', str(tmp_path / 'cache'))
    monkeypatch.setattr(calibration, 'model', lambda **kwargs: MODEL)
    # the 3 MB test matrix sits in the CPU caches: auto scores it densely without the model, unless told otherwise
    monkeypatch.setattr(planner, 'MIN_PRUNED_BYTES', 0 if measured else 16 * 2 ** 20)
    import numba
    import torch
    threads = numba.get_num_threads(), torch.get_num_threads()
    try:  # the benchmark sets numba's and torch's threads for the process: the other tests' machine key needs them back
        assert auto.main(['--docs', '12000', '--dims', '64', '--single', '2', '--rounds', '1', '--per-block', '1',
                          '--batches', '4', '--threads', '1', '--cache', str(tmp_path / 'bench')]) == 0
    finally:
        numba.set_num_threads(threads[0])
        torch.set_num_threads(threads[1])
    out = capsys.readouterr().out
    rows = [line.split(' | ') for line in out.splitlines() if line.startswith(('| 1 × ', '| 4 × '))]
    assert len(rows) == 5 + 3  # RDIME and Top-k 0.25 / 0.35 / 0.50 / 0.75 one at a time; 3 batches of 4
    took = {row[5] for row in rows}
    if measured:  # the timed choice follows this machine's timings: under load any path, several in one row
        assert {path for cell in took for path in cell.split('/')} <= set(planner.PATHS), took
        assert list((tmp_path / 'cache' / 'cost' / 'measured').glob('*.json'))
    else:
        assert took == {'dense'}
    assert all(row[8].split('/')[2] == '0' for row in rows)  # no mismatch against the dense top-100
    assert 'auto within 2 % of the fastest path in' in out
