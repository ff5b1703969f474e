"""A grid's cells as Ray tasks (``--cells``) on a real local Ray cluster (a head without CPUs and two nodes of one CPU,
started once for the module): the same output files as the serial grid (run_grid and the command), a node removed
mid-cell (the cell blocks until its node is gone) re-runs only that cell, elsewhere, a cell lost past its retries
fails alone, the wait for a node is bounded, a node running other code refuses its cell, and ``--cells`` is checked."""
import json
import os
import threading
import time
from pathlib import Path

import pytest
from conftest import START_UP, shared_collection

from pyterrier_rdime.experiment import grid as cells_module
from pyterrier_rdime.experiment.cli import main
from pyterrier_rdime.experiment.grid import CELL_FILE, run_grid
from pyterrier_rdime.experiment.runner import run_experiment

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings('ignore::DeprecationWarning')]

SETTINGS = dict(dimes=['prf'], ks=[0.5], depth=5, max_queries=3, first_stage='bm25', controls=['random'],
                control_seeds=2, verbose=False)
SMALL_NODE = {'num_cpus': 1, 'object_store_memory': 80 * 2 ** 20}
#: Seconds a test waits for a cell to start or finish on the loaded machine: generous, never unbounded.
WAIT = 400


@pytest.fixture(scope='module')
def local_cluster():
    """A head that runs no cell (no CPU: the driver's node stays up) and two nodes of one CPU each."""
    ray = pytest.importorskip('ray', reason='ray is not installed: pip install pyterrier-rdime[ray]')
    from ray.cluster_utils import Cluster
    os.environ.setdefault('RAY_USAGE_STATS_ENABLED', '0')
    local = Cluster(initialize_head=True, head_node_args={**SMALL_NODE, 'num_cpus': 0, 'include_dashboard': False})
    for _ in range(2):
        local.add_node(**SMALL_NODE)
    ray.init(address=local.address, log_to_driver=False, configure_logging=False)
    yield local
    ray.shutdown()
    local.shutdown()


@pytest.fixture(scope='module')
def collections():
    return [str(shared_collection('cranfield')), str(shared_collection('cisi'))]


@pytest.fixture(scope='module')
def serial(collections, tmp_path_factory):
    """The grid run one cell after another, in this process: the outputs to equal."""
    out, cache = tmp_path_factory.mktemp('serial'), tmp_path_factory.mktemp('cache')
    result = run_grid(collections, ['minilm'], out, cache_dir=cache, **SETTINGS)
    assert [c.status for c in result.cells] == ['done', 'done'] and not result.problems
    return out, cache


def outputs(folder: Path) -> dict:
    """Every output file's bytes under ``folder``, but results.json's timings (which differ between two runs)."""
    found = {}
    for path in sorted(p for p in folder.rglob('*') if p.is_file() and '.progress' not in p.parts):
        name = path.relative_to(folder).as_posix()
        if path.name == 'results.json':
            payload = json.loads(path.read_text())
            payload.pop('timings')
            found[name] = payload
        else:
            found[name] = path.read_bytes()
    return found


def assert_same_outputs(out: Path, expected: Path) -> None:
    got, want = outputs(out), outputs(expected)
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name] == want[name], name


def test_cells_on_a_cluster_equal_the_serial_grid(local_cluster, serial, collections, tmp_path):
    expected, cache = serial
    result = run_grid(collections, ['minilm'], tmp_path, cache_dir=cache, cells=2, **SETTINGS)
    assert [c.status for c in result.cells] == ['done', 'done'] and not result.problems
    assert_same_outputs(tmp_path, expected)
    again = run_grid(collections, ['minilm'], tmp_path, cache_dir=cache, cells=2, **SETTINGS)
    assert [c.status for c in again.cells] == ['skipped', 'skipped']  # recorded as the serial grid records them


def test_the_command_with_cells_writes_what_it_writes_serially(local_cluster, serial, collections, tmp_path,
                                                                capsys):
    argv = collections + ['--encoder', 'minilm', '--dimes', 'prf', '--ks', '0.5', '--depth', '5', '--max-queries', '3',
                          '--first-stage', 'bm25', '--controls', 'random', '--control-seeds', '2', '--quiet',
                          '--cache', str(serial[1])]
    assert main(argv + ['--out', str(tmp_path / 'serial')]) == 0
    assert main(argv + ['--out', str(tmp_path / 'cells'), '--cells', '2', '--ray-address', local_cluster.address]) == 0
    assert 'cranfield × minilm: done, cisi × minilm: done' in capsys.readouterr().out
    assert_same_outputs(tmp_path / 'cells', tmp_path / 'serial')


def test_a_node_lost_mid_cell_reruns_only_that_cell(local_cluster, serial, collections, tmp_path):
    import ray
    expected, cache = serial
    signals, out = tmp_path / 'signals', tmp_path / 'out'
    signals.mkdir()

    def cisi_waits_for_its_node_to_go(collection, **kwargs):  # a closure: Ray ships it to the nodes by value
        node = ray.get_runtime_context().get_node_id()
        with open(signals / 'calls', 'a') as f:
            f.write(f'{Path(collection.name).name} {node}\n')
        if collection.name.endswith('cisi') and not list(signals.glob('started-*')):  # the first attempt only
            (signals / f'started-{node}').touch()
            deadline = time.monotonic() + WAIT
            while time.monotonic() < deadline:
                time.sleep(0.5)
            raise RuntimeError('the node of this cell was not removed in time')
        return run_experiment(collection, **kwargs)

    done = {}
    runner = threading.Thread(target=lambda: done.setdefault('grid', run_grid(
        collections, ['minilm'], out, cache_dir=cache, cells=2, run_cell=cisi_waits_for_its_node_to_go,
        **SETTINGS)))
    runner.start()
    deadline = time.monotonic() + WAIT
    while not (list(signals.glob('started-*')) and (out / 'cranfield' / 'minilm' / CELL_FILE).is_file()):
        assert time.monotonic() < deadline and runner.is_alive(), 'the cells did not start, or cranfield not finish'
        time.sleep(1)
    node_id = list(signals.glob('started-*'))[0].name.removeprefix('started-')
    lost = next(n for n in local_cluster.list_all_nodes() if n.node_id == node_id)
    local_cluster.remove_node(lost)
    runner.join(WAIT)
    local_cluster.add_node(**SMALL_NODE)  # the module's cluster as it was
    assert not runner.is_alive(), 'the grid did not finish after the node was lost'
    result = done['grid']
    assert [c.status for c in result.cells] == ['done', 'done'] and not result.problems
    calls = (signals / 'calls').read_text().split('\n')[:-1]
    assert sorted(line.split()[0] for line in calls) == ['cisi', 'cisi', 'cranfield']  # cranfield kept, cisi again
    cisi_nodes = [line.split()[1] for line in calls if line.startswith('cisi')]
    assert cisi_nodes[0] == node_id != cisi_nodes[1]
    assert_same_outputs(out, expected)


def test_a_cell_lost_past_its_retries_fails_and_the_others_finish(local_cluster, collections, serial, tmp_path,
                                                                  monkeypatch):
    monkeypatch.setattr(cells_module, 'RETRIES', 0)

    def cisi_crashes_its_worker(collection, **kwargs):  # as a worker process killed (out of memory, a signal)
        if collection.name.endswith('cisi'):
            os._exit(1)
        return run_experiment(collection, **kwargs)
    result = run_grid(collections, ['minilm'], tmp_path, cache_dir=serial[1], cells=2,
                      run_cell=cisi_crashes_its_worker, **SETTINGS)
    assert [c.status for c in result.cells] == ['done', 'failed']
    assert result.cells[1].error.startswith('lost: WorkerCrashedError')
    assert 'after 0 retries it is left for the next run of the same command' in result.cells[1].error
    assert (tmp_path / 'cranfield' / 'minilm' / CELL_FILE).is_file()
    assert not (tmp_path / 'cisi' / 'minilm' / CELL_FILE).exists()


def test_the_cells_wait_for_a_node_within_a_bound(local_cluster, collections, serial, tmp_path, monkeypatch):
    monkeypatch.setattr(cells_module, 'NO_NODE_TIMEOUT', 1)
    monkeypatch.setattr(cells_module, 'POLL', 0.5)
    started = time.monotonic()
    result = run_grid(collections, ['minilm'], tmp_path, cache_dir=serial[1], cells=2, workers=64, **SETTINGS)
    assert time.monotonic() - started < 60
    assert [c.status for c in result.cells] == ['failed', 'failed']
    assert 'no live node of the cluster offered the 64 CPU(s) a cell needs for 1 s' in result.cells[0].error


@pytest.mark.parametrize('value, message', [
    ('0', '--cells must be an integer >= 1, got 0'),
    ('-2', '--cells must be an integer >= 1, got -2'),
    ('2', "--cells 2 runs the grid's cells as Ray tasks: pass --ray-address"),
])
def test_bad_cells_are_refused_before_any_work(value, message, collections, tmp_path, capsys):
    assert main(collections + ['--cells', value, '--out', str(tmp_path / 'out'), '--cache',
                               str(tmp_path / 'cache'), '--quiet']) == 2
    assert message in capsys.readouterr().err


def test_run_grid_checks_cells(collections, tmp_path):
    with pytest.raises(ValueError, match="run_grid: cells must be an integer >= 1, got 0; the cells run at once"):
        run_grid(collections, ['minilm'], tmp_path, cells=0, **SETTINGS)


def test_a_node_running_other_code_refuses_the_cell(collections, tmp_path):
    from pyterrier_rdime.experiment import grid as grid_module
    cell = grid_module.plan(collections[:1], ['minilm'], tmp_path, **SETTINGS)[0]
    cell.inputs['code'] = 'an-older-one'

    def never(collection, **kwargs):
        raise AssertionError('the cell ran')
    grid_module._compute_on_node(cell, run_cell=never, settings=SETTINGS)
    assert cell.status == 'failed' and not (cell.folder / CELL_FILE).exists()
    assert 'than the driver (an-older-one): install the same version of pyterrier-rdime' in cell.error


@pytest.fixture
def not_connected(monkeypatch):
    """This process as one not connected to Ray yet (the module's cluster may be), and no cluster that ``'auto'``
    could find on this machine (Ray looks for RAY_ADDRESS, the address ``ray start`` recorded, then any GCS
    process: other clusters may run here)."""
    import ray
    from ray._private import services
    monkeypatch.setattr(ray, 'is_initialized', lambda: False)
    monkeypatch.delenv('RAY_ADDRESS', raising=False)
    monkeypatch.setattr(services, 'find_gcs_addresses', lambda: [])
    monkeypatch.setattr(services, 'find_bootstrap_address', lambda temp_dir: None)


def free_port() -> int:
    import socket
    with socket.socket() as unused:
        unused.bind(('127.0.0.1', 0))
        return unused.getsockname()[1]


@pytest.fixture
def http_server():
    """``host:port`` of a local ``python -m http.server``: a service that accepts TCP and answers, but is not Ray."""
    import socket
    import subprocess
    import sys
    port = free_port()
    server = subprocess.Popen([sys.executable, '-m', 'http.server', str(port), '--bind', '127.0.0.1'],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + START_UP
        while True:
            try:
                socket.create_connection(('127.0.0.1', port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, 'http.server did not start'
                time.sleep(0.1)
        yield f'127.0.0.1:{port}'
    finally:
        server.kill()
        server.wait()


def test_a_ray_address_that_is_not_ray_fails_at_once_naming_the_option(not_connected, http_server, collections,
                                                                          tmp_path, capsys):
    started = time.monotonic()
    assert main(collections + ['--cells', '2', '--ray-address', http_server, '--out', str(tmp_path / 'out'),
                               '--cache', str(tmp_path / 'cache'), '--quiet']) == 2
    assert time.monotonic() - started < 120  # an answer, not Ray's minutes of retries (generous: a loaded machine)
    err = capsys.readouterr().err
    assert err.count('\n') == 1  # one line, no log of Ray's
    assert err.startswith(f"rdime-experiment: error: --ray-address: the service at '{http_server}' accepts "
                          "connections but is not a Ray cluster (a Ray cluster's GCS answers gRPC; it answered b'")
    assert "pass the Ray head node's 'host:port'" in err


def test_a_ray_address_that_stays_silent_fails_within_the_timeout(not_connected):
    import socket

    from pyterrier_rdime.pruned.sharded import connect
    with socket.socket() as silent:  # accepts connections (the kernel's backlog), never answers
        silent.bind(('127.0.0.1', 0))
        silent.listen()
        address = '127.0.0.1:%d' % silent.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(ConnectionError, match=rf"^--ray-address: the service at '{address}' accepts connections "
                                                  r'but is not a Ray cluster \(.*it sent nothing back within '
                                                  r'timeout=2 s\)'):
            connect(address, 2, '--ray-address')
        assert time.monotonic() - started < 2 + 20


def test_ray_address_auto_without_a_cluster_names_our_option(not_connected, collections, tmp_path, capsys):
    assert main(collections + ['--cells', '2', '--ray-address', 'auto', '--out', str(tmp_path / 'out'), '--cache',
                               str(tmp_path / 'cache'), '--quiet']) == 2
    err = capsys.readouterr().err
    assert err == ('rdime-experiment: error: --ray-address auto: this machine belongs to no Ray cluster (none was '
                   'started here with ray start, and RAY_ADDRESS is not set): start one (ray start --head), or pass '
                   "the head node's 'host:port', or 'local' to start Ray on this machine\n")
