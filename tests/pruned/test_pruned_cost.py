"""The cost model behind strategy='auto': costs computed by hand from round constants, the paths it chooses, and its
calibration on the machine in use (cached per CPU model and thread count, re-used, re-run on demand; never run for a
matrix that sits in the caches). No timed assertions: the calibration's values depend on the machine."""
import dataclasses
import functools
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from pyterrier_rdime import _config
from pyterrier_rdime.pruned import calibration, dense, kept, planner

COMPILED = pytest.mark.skipif(not kept.NUMBA_AVAILABLE,
                              reason='the compiled kernel needs numba: pip install pyterrier-rdime[fast]')
# the compressed path: 0.05 + 0.25 x kept per query for the scan, 2 ms per call, and 1.5 k x kept dims values
# re-scored at 1 ms each, the last two in units of a gemv over a matrix of b bytes taking b microseconds (10 ms over
# 10 kB); in one pass, 1 + 0.05 per query for the first pass, 1 ms per query and the same re-scoring
ROUND = planner.CostModel(dense_gemm_fixed=2.0, dense_gemm_per_query=0.1, pruned_fixed=0.1, pruned_slope=1.0,
                          batch_per_query=0.05, batch_union=2.0, batch_per_kept=0.2, compressed_fixed=0.05,
                          compressed_slope=0.25, compressed_call_seconds=2e-3, compressed_pass_fixed=1.0,
                          compressed_pass_per_query=0.05, compressed_pass_call_seconds=1e-3, rescore_seconds=1e-3,
                          gemv_seconds_per_byte=1e-6)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache folder and no model in memory."""
    monkeypatch.setenv('PYTERRIER_RDIME_CACHE', str(tmp_path))
    monkeypatch.setattr(calibration, '_MODELS', {})
    return tmp_path


@pytest.fixture
def no_calibration(monkeypatch):
    def fail(**kwargs):
        raise AssertionError('calibrated')
    monkeypatch.setattr(calibration, 'calibrate', fail)


def costs(queries, k=1, matrix_bytes=2 ** 30, one_pass=None):
    one_pass = len(queries) > 1 if one_pass is None else one_pass
    return ROUND.path_costs(queries, k=k, matrix_bytes=matrix_bytes, one_pass=one_pass)


def test_costs_by_hand(monkeypatch):
    monkeypatch.setattr(dense, 'NESTED_ADD_COST', 8)  # a row alone is cheaper by the int8 product
    # one unit per dense gemv
    half = np.zeros((1, 8), dtype=np.float32)
    half[0, :4] = 1
    assert ROUND.dense_cost(1) == 1 and ROUND.dense_cost(3) == 3 and ROUND.dense_cost(10) == pytest.approx(3.0)
    # one by one 0.1 + 0.5; compressed 0.05 + 0.25 x 0.5 + (2 ms + 1.5 x 4 values x 1 ms) / (1e-6 s/byte x 2^30 bytes)
    assert costs(half) == pytest.approx({'dense': 1.0, 'pruned': 0.6, 'compressed': 0.175 + 8e-3 / 2 ** 30 * 1e6})
    # over a matrix of 10 kB a gemv takes 10 ms: the call and re-scoring 6 values cost 0.8 of it; 40 results 24.2
    assert costs(half, matrix_bytes=10_000)['compressed'] == pytest.approx(0.175 + 0.8)
    assert costs(half, k=40, matrix_bytes=10_000)['compressed'] == pytest.approx(0.175 + 24.2)
    assert costs(np.ones((1, 8)))['pruned'] == pytest.approx(1.1)
    ten = np.repeat(half, 10, axis=0)  # same kept set: one by one 6.0, one pass 0.5 + 2 x 0.5 + 0.2 x 5 = 2.5
    assert planner.batch_features(ten).tolist() == [10, 0.5, 5.0]
    assert costs(ten)['one pass'] == pytest.approx(2.5)
    assert costs(ten)['compressed'] == pytest.approx(10 * costs(half)['compressed'])  # query after query
    # one pass: 1 + 0.05 x 10, and per query 1 ms + 6 ms of re-scoring over a 10 kB matrix (a 10 ms gemv); the
    # same rows nested (the second extends the first...) cost (4 dims + 10 rows) x NESTED_ADD_COST / 16 rows
    ten_others = ten * np.arange(1, 11, dtype=np.float32)[:, None]
    assert costs(ten_others, matrix_bytes=10_000)['compressed one pass'] == pytest.approx(1.5 + 10 * 0.7)
    assert costs(ten, matrix_bytes=10_000)['compressed one pass'] == pytest.approx(1 + 0.05 * 14 * 8 / 16 + 10 * 0.7)
    assert costs(ten)['dense'] == pytest.approx(3.0) and list(costs(ten)) == ['dense', 'pruned', 'one pass',
                                                                             'compressed', 'compressed one pass']
    assert list(costs(ten, one_pass=False)) == ['dense', 'pruned', 'compressed']
    assert costs(np.ones((10, 8), dtype=np.float32))['one pass'] == pytest.approx(4.5)  # 0.5 + 2 + 2
    assert planner.nonzero_fractions(np.array([[0, 1, 2, 0], [0, 0, 0, 0]])).tolist() == [0.5, 0.0]
    assert planner.batch_features(half[:0]).tolist() == [0, 0, 0]


def test_fit_non_negative_by_hand():
    features = np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 2.0]])
    assert calibration.fit_non_negative(features, np.array([1.0, 2.0, 3.0])) == pytest.approx([1.0, 1.0])
    # falling costs would need a negative slope: slope 0 and the constant c minimising sum (c / y - 1)^2,
    # c = sum(1 / y) / sum(1 / y^2) = (1/3 + 1/2 + 1) / (1/9 + 1/4 + 1)
    fitted = calibration.fit_non_negative(features, np.array([3.0, 2.0, 1.0]))
    assert fitted == pytest.approx([(1 / 3 + 1 / 2 + 1) / (1 / 9 + 1 / 4 + 1), 0.0])


def test_plan_of_each_strategy():
    half = np.zeros((1, 8), dtype=np.float32)
    half[0, :4] = 1
    ten = np.repeat(half, 10, axis=0)  # one pass 2.5 < one by one 6.0 (test_costs_by_hand)
    spread = np.eye(8, dtype=np.float32)[:2]  # disjoint kept sets: one by one 2 x 0.225 < one pass 0.1 + 0.5 + 0.05

    def decide(queries, strategy, matrix_bytes=2 ** 30, compiled=True, k=1):
        return planner.choose(queries, strategy=strategy, matrix_bytes=matrix_bytes, compiled=compiled,
                              model=lambda: ROUND, k=k).path

    assert decide(half, 'auto', 2 ** 10) == 'dense'  # a matrix in the caches
    assert decide(half, 'auto', compiled=False) == 'dense'  # no compiled kernel
    assert decide(half[:0], 'auto') == 'dense'
    # a large matrix: the compressed scan (0.175) beats pruned (0.6) and dense (1); ten in one pass 1.5 < 1.75
    # query after query < 2.5 (float32 one pass) < 3 (dense)
    assert decide(half, 'auto') == 'compressed' and decide(ten, 'auto') == 'compressed one pass'
    # 32 MiB: a gemv takes 33.6 s; 10,000 results re-score 60,000 values of a half-kept query (60 s, 1.8 gemv): the
    # compressed path costs 1.97, pruned 0.6, dense 1
    assert decide(half, 'auto', 2 ** 25, k=10_000) == 'pruned' and decide(ten, 'auto', 2 ** 25, k=10_000) == 'one pass'
    assert decide(spread, 'auto', 2 ** 25, k=10_000) == 'pruned'
    assert decide(np.ones((1, 8)), 'auto', 2 ** 25, k=10_000) == 'dense'  # 1 < 1.1
    assert decide(np.ones((10, 8), dtype=np.float32), 'auto', 2 ** 25, k=10_000) == 'dense'  # 3.0 < 4.5
    assert decide(ten, 'pruned') == 'one pass' and decide(spread, 'pruned') == 'pruned'
    assert decide(spread, 'pruned', 2 ** 10) == 'one pass'  # in the caches: one pass reads them once
    assert decide(ten, 'pruned', compiled=False) == 'pruned'  # the numpy path goes query by query
    assert decide(np.ones((10, 8)), 'pruned') == 'one pass' and decide(half, 'dense') == 'dense'
    assert decide(ten, 'compressed') == 'compressed one pass' and decide(half, 'compressed') == 'compressed'
    assert decide(spread, 'compressed') == 'compressed'  # 2 x (0.05 + 0.25 / 8) = 0.16 < 1.1 in one pass
    assert decide(spread, 'compressed', 2 ** 10) == 'compressed one pass'  # in the caches
    assert decide(ten, 'compressed', compiled=False) == 'compressed'  # the numpy path goes query by query
    assert planner.Plan('one pass').strategy == 'pruned' and planner.Plan('compressed').strategy == 'compressed'
    assert planner.Plan('compressed one pass').strategy == 'compressed'
    with pytest.raises(ValueError, match='unknown path'):
        planner.Plan('fast')
    with pytest.raises(ValueError, match='unknown strategy'):
        decide(half, 'fast')


def test_an_exact_tie_goes_to_the_path_listed_first():
    tied = dataclasses.replace(ROUND, pruned_fixed=0.0, pruned_slope=2.0, compressed_fixed=1.0, compressed_slope=0.0,
                               compressed_call_seconds=0.0, rescore_seconds=0.0)
    half = np.zeros((1, 8), dtype=np.float32)
    half[0, :4] = 1  # dense 1, pruned 2 x 0.5 = 1, compressed 1
    assert planner.choose(half, strategy='auto', matrix_bytes=2 ** 30, compiled=True, model=lambda: tied,
                          k=10).path == 'dense'


def test_plan_calls_the_model_only_when_it_decides():
    def fail():
        raise AssertionError('calibrated')
    one = np.ones((1, 8), dtype=np.float32)
    for strategy, queries, matrix_bytes in (('dense', one, 2 ** 30), ('compressed', one, 2 ** 30),
                                            ('pruned', one, 2 ** 30), ('pruned', np.ones((3, 8)), 2 ** 10),
                                            ('auto', one, 2 ** 10)):
        planner.choose(queries, strategy=strategy, matrix_bytes=matrix_bytes, compiled=True, model=fail, k=10)


@COMPILED
def test_calibration_is_cached_per_machine_and_thread_count(cache, monkeypatch):
    import numba
    fitted = calibration.calibrate(docs=4096, rounds=1)
    path = calibration.cache_path()
    assert path.parent == cache / 'cost' and f'-{numba.get_num_threads()}threads-blas' in path.name
    record = json.loads(path.read_text())
    assert record['model'] == dataclasses.asdict(fitted) and record['machine'] == calibration.machine_key()
    assert all(np.isfinite(v) for v in record['model'].values()) and record['timings_in_gemv']['gemv'] == 1.0
    assert min(dataclasses.asdict(fitted).values()) >= 0
    assert set(record['fit_relative_errors']) == {name for name in record['timings_in_gemv'] if
                                                  name.startswith(('one', 'pass', 'compressed 0.', 'compressed pass'))}
    monkeypatch.setattr(calibration, '_MODELS', {})  # a new process: read from the file, not calibrated again
    monkeypatch.setattr(calibration, 'calibrate', lambda **kwargs: pytest.fail('calibrated again'))
    assert calibration.model() == fitted
    calls = []
    monkeypatch.setattr(calibration, 'calibrate', lambda **kwargs: calls.append(calibration.machine_key()) or ROUND)
    if numba.config.NUMBA_NUM_THREADS > 1:  # another thread count of the kernel is another calibration
        threads = numba.get_num_threads()
        numba.set_num_threads(1)
        try:
            assert calibration.model() == ROUND and calls == [calibration.machine_key()] and '-1threads-' in calls[0]
        finally:
            numba.set_num_threads(threads)
    from threadpoolctl import threadpool_limits
    blas = calibration.machine_key().rsplit('-blas', 1)[1]
    if blas not in ('1', 'unknown'):  # so is another thread count of BLAS (the dense path)
        with threadpool_limits(1, user_api='blas'):
            assert calibration.machine_key().endswith('-blas1') and calibration.model() == ROUND
            assert calls[-1].endswith('-blas1')
    monkeypatch.setattr(calibration, 'KERNELS', calibration.KERNELS + 1)  # newer kernels: calibrated again
    assert calibration.model() == ROUND and f'-k{calibration.KERNELS}-' in calls[-1]


@COMPILED
def test_a_broken_cache_file_is_recalibrated(cache, monkeypatch):
    calibration.cache_path().parent.mkdir(parents=True)
    calibration.cache_path().write_text('{"model": {"dense_gemm_fixed": 1}}')  # from another version: missing constants
    monkeypatch.setattr(calibration, 'calibrate', lambda **kwargs: ROUND)
    assert calibration.model() == ROUND


@COMPILED
def test_the_calibration_command(cache, monkeypatch, capsys):
    from pyterrier_rdime.pruned import __main__ as command
    monkeypatch.setattr(calibration, 'calibrate', lambda **kwargs: ROUND)
    assert command.main([]) == 0
    out = capsys.readouterr().out
    assert f'saved to {calibration.cache_path()}' in out
    # ROUND over 1M x 768 float32 (3.072e9 bytes, a gemv of 3072 s), one query, top 100: pruned 0.1 + kept; compressed
    # 0.05 + 0.25 kept + (2 ms + 1 ms x 1.5 x 100 x kept x 768) / 3072 s
    assert 'a dense search takes about 3072000 ms' in out
    assert "25% of the dimensions kept: pruned 0.35x, compressed 0.12x -> strategy='auto' takes compressed" in out
    assert "50% of the dimensions kept: pruned 0.60x, compressed 0.19x" in out
    assert "75% of the dimensions kept: pruned 0.85x, compressed 0.27x" in out
    with pytest.raises(SystemExit):
        command.main(['--help'])
    help_text = ' '.join(capsys.readouterr().out.split())
    assert "Re-calibrates the cost model of PrunedRetriever(strategy='auto') on this machine" in help_text
    assert '``' not in help_text  # plain text, not the module docstring's RST
    with pytest.raises(SystemExit) as stop:
        command.main(['--threads', '0'])
    assert stop.value.code == 2 and '--threads must be between 1 and' in capsys.readouterr().err


class _Machine:
    """A machine whose paths cost exactly what ``TRUE`` says (in ms on a fake clock: a gemv over the calibration's
    768 x 4096 float32 matrix takes 1 ms, over the 768 x 256 matrix of the compressed path's calls 1/16 ms), for the
    calibration to recover."""
    TRUE = planner.CostModel(dense_gemm_fixed=1.5, dense_gemm_per_query=0.2, pruned_fixed=0.05, pruned_slope=0.9,
                             batch_per_query=0.03, batch_union=1.0, batch_per_kept=0.25, compressed_fixed=0.02,
                             compressed_slope=0.3, compressed_call_seconds=1e-4, compressed_pass_fixed=0.4,
                             compressed_pass_per_query=0.06, compressed_pass_call_seconds=5e-4, rescore_seconds=2e-9,
                             gemv_seconds_per_byte=1e-3 / (768 * 4096 * 4))

    def __init__(self, disturbed=()):
        self.now, self.disturbed = 0.0, disturbed

    def perf_counter(self):
        return self.now

    def dense(self, matrix, query_vecs, k, **kwargs):
        self.now += self.TRUE.dense_cost(len(query_vecs)) / 1000

    def pruned(self, matrix, query_vecs, k, one_pass):
        one = len(query_vecs) == 1
        slow = 3.0 if (len(query_vecs), one) in self.disturbed else 1.0
        estimate = self.TRUE.pruned_one_by_one_cost(query_vecs) if one else self.TRUE.pruned_batch_cost(query_vecs)
        self.now += slow * estimate / 1000

    def compressed(self, copy, matrix, query_vecs, k, use_numba, one_pass=False, doc_rows=None):
        gemv = self.TRUE.gemv_seconds_per_byte * matrix.nbytes
        path_cost = self.TRUE.compressed_one_pass_cost if one_pass else self.TRUE.compressed_cost
        self.now += path_cost(query_vecs, k, matrix.nbytes) * gemv

    def first_pass(self, codes, weights, slack, k, nested):
        gemv = self.TRUE.gemv_seconds_per_byte * codes.nbytes * 4  # the float32 matrix's
        rows, parents = nested  # a nested row costs its own dimensions and a copy, at NESTED_ADD_COST / (2 dims)
        sizes = np.count_nonzero(weights[rows], axis=1)
        adds = sizes - np.where(parents >= 0, sizes[parents], 0) + 1
        units = len(weights) - len(rows) + dense.NESTED_ADD_COST * adds.sum() / (2 * weights.shape[1])
        self.now += (self.TRUE.compressed_pass_fixed + self.TRUE.compressed_pass_per_query * units) * gemv

    def exact_scores(self, matrix, query_vecs, docids, doc_rows=None, *, use_numba):
        values = sum(len(ids) * np.count_nonzero(q) for q, ids in zip(query_vecs, docids))
        self.now += self.TRUE.rescore_seconds * values


@pytest.fixture
def fake_machine(monkeypatch):
    """Calibration against a fake clock: returns a function installing a machine (with some batch sizes slowed)."""
    import time

    from pyterrier_rdime.pruned import _numba, compressed, dense

    def install(disturbed=()):
        machine = _Machine(disturbed)
        monkeypatch.setattr(calibration, 'time', type('Clock', (), {'perf_counter': machine.perf_counter,
                                                             'strftime': staticmethod(time.strftime)}))
        monkeypatch.setattr(dense, 'search_dense', machine.dense)
        monkeypatch.setattr(_numba, 'fused_top_k', machine.pruned)
        monkeypatch.setattr(compressed, 'search_compressed', machine.compressed)
        monkeypatch.setattr(compressed, 'exact_scores', machine.exact_scores)
        monkeypatch.setattr(compressed, 'integer_candidates', machine.first_pass)
        return machine
    return install


@COMPILED
def test_calibration_recovers_the_costs_of_the_machine(cache, fake_machine, caplog):
    fake_machine()
    fitted = calibration.calibrate(docs=4096, rounds=1, save=False)
    for name, value in dataclasses.asdict(_Machine.TRUE).items():
        # the calls' own work is timed on a matrix whose scan (0.02 x 1/16 ms) it cannot tell apart: within 2 %
        assert getattr(fitted, name) == pytest.approx(value, rel=0.02, abs=0 if value < 1e-3 else 0.01), name
    assert 'misses the timing' not in caplog.text


@COMPILED
def test_a_disturbed_calibration_warns(cache, fake_machine, caplog):
    fake_machine(disturbed={(8, False)})  # every batch of 8 timed 3x too slow: no model of the form fits
    with caplog.at_level('WARNING', logger=calibration.__name__):
        calibration.calibrate(docs=256, rounds=1)
    assert 'misses the timing of "pass ' in caplog.text and 'python -m pyterrier_rdime.pruned' in caplog.text
    errors = json.loads(calibration.cache_path().read_text())['fit_relative_errors']
    assert max(errors.values()) > calibration.FIT_TOLERANCE


def test_the_key_counts_the_threads_of_numpy_s_blas_only(monkeypatch):
    # scipy loads a BLAS of its own beside numpy's (a thread limit set before it loaded does not reach it): the dense
    # path runs on numpy's, the only one the calibration's key may count
    pytest.importorskip('threadpoolctl')
    pytest.importorskip('scipy.linalg')
    monkeypatch.setattr(calibration, '_blas', functools.lru_cache(maxsize=1)(calibration._blas.__wrapped__))
    paths = [Path(info['filepath']) for info in calibration._blas().info()]
    if not any(p.parent.name.startswith('numpy') for p in paths):
        pytest.skip("numpy uses the system's BLAS here")
    assert paths and all(p.parent.name.startswith('numpy') for p in paths)


ZEN3 = ('processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC\n'
        'flags\t\t: fpu avx2\n')
ZEN4 = ZEN3.replace(': 1\n', ': 17\n').replace('avx2', 'avx2 avx512f avx512_vnni')


@pytest.mark.parametrize('cpuinfo', [ZEN3, ZEN4])
def test_cpu_info_reads_the_first_processor(tmp_path, cpuinfo):
    path = tmp_path / 'cpuinfo'
    path.write_text(cpuinfo + '\n' + cpuinfo.replace('processor\t: 0', 'processor\t: 1').replace('EPYC', 'other'))
    info = _config.cpu_info(str(path))
    assert (info['model name'], info['cpu family']) == ('AMD EPYC', '25') and 'avx2' in info['flags'].split()
    assert _config.cpu_info(str(tmp_path / 'absent')) == {}


def test_one_cpu_name_of_two_generations_gets_two_calibrations(tmp_path, monkeypatch):
    """Zen 3 and Zen 4 are both "AMD EPYC": a cost model timed on one (int8 products 25x apart) must not serve the
    other, so the key names the family, model and widest instructions."""
    keys = []
    for text in (ZEN3, ZEN4):
        (tmp_path / 'cpuinfo').write_text(text)
        monkeypatch.setattr(calibration, 'cpu_info', lambda: _config.cpu_info.__wrapped__(str(tmp_path / 'cpuinfo')))
        calibration._cpu.cache_clear()
        keys.append(calibration.machine_key())
    calibration._cpu.cache_clear()
    assert keys[0].startswith('amd-epyc-25-1-avx2-') and keys[1].startswith('amd-epyc-25-17-avx512vnni-')


def test_the_int8_product_is_torch_only_with_int8_dot_product_instructions():
    assert dense.int8_product({'avx2', 'avx512f'}) == 'float64'
    expected = 'torch' if importlib.util.find_spec('torch') else 'float64'
    assert dense.int8_product({'avx2', 'avx512_vnni'}) == dense.int8_product({'amx_int8'}) == expected


def test_a_nested_batch_costs_the_one_pass_its_own_dimensions_only(monkeypatch):
    """Five prefixes of one query's ordering (Top-k fractions up to the whole query) and an unrelated subset: the
    prefixes cost NESTED_ADD_COST / (2 dims) per dimension, once (768 of them), the subset a whole product row."""
    monkeypatch.setattr(dense, 'NESTED_ADD_COST', 8)  # the chain pays (8 x 773 < 2 x 5 x 768), a row alone not
    rng = np.random.default_rng(0)
    query = rng.standard_normal(768).astype(np.float32)
    rows = np.zeros((6, 768), dtype=np.float32)
    order = np.argsort(-np.abs(query))
    for row, size in enumerate((192, 269, 384, 576, 768)):
        rows[row, order[:size]] = query[order[:size]]
    rows[5, rng.choice(768, 300, replace=False)] = 1.0
    assert planner.one_pass_rows(rows) == pytest.approx(1 + 8 * (768 + 5) / (2 * 768))  # and a copy per row
    assert planner.one_pass_rows(rows[[0, 5]]) == 2  # one prefix alone extends nothing
