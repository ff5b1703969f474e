"""A grid's cells as Ray tasks: up to ``--cells`` of them in flight on a cluster, each computed on its node by
:func:`~.grid.compute_cell`, a lost cell run again elsewhere, and every wait bounded."""
import logging
import time
from typing import Callable, Dict, List, Optional, Sequence

import pyterrier as pt

logger = logging.getLogger(__name__)

#: Times a cell is run again after its node or worker was lost; its own errors are never retried.
RETRIES = 3
#: Seconds between two looks at the cells in flight.
POLL = 5
#: Seconds the cells may wait while no live node offers the CPUs one needs.
NO_NODE_TIMEOUT = 120
#: Seconds to fetch a finished cell's result, and to connect to ``ray_address``.
FETCH_TIMEOUT = 60


def run_cells(pending: Sequence, compute: Callable, *, cells: int, total: int, ray_address: Optional[str] = None,
              cpus: int = 1, verbose: bool = True) -> None:
    """Runs ``compute(cell)`` for each of the ``pending`` cells as a Ray task reserving ``cpus`` CPUs, ``cells`` at
    once, and copies each result onto the driver's cell. Bounded by :data:`RETRIES`, :data:`NO_NODE_TIMEOUT` and
    :data:`FETCH_TIMEOUT`; interrupted, the cells in flight are cancelled."""
    if not pending:
        return
    try:
        import ray
    except ImportError:
        raise ImportError("--cells needs Ray: pip install 'pyterrier-rdime[ray]' (from a clone: pip install "
                          "'.[ray]')") from None
    from ..pruned.sharded import connect
    connect(ray_address, FETCH_TIMEOUT, '--ray-address')
    task = ray.remote(_task).options(num_cpus=cpus, max_retries=RETRIES, retry_exceptions=False)
    queue: List = list(pending)
    running: Dict[object, object] = {}
    waiting_since = None
    with pt.tqdm(total=total, initial=total - len(pending), desc='cells', unit='cell', disable=not verbose) as bar:
        try:
            while queue or running:
                while queue and len(running) < cells:
                    cell = queue.pop(0)
                    running[task.remote(compute, cell)] = cell
                ready, _ = ray.wait(list(running), num_returns=1, timeout=POLL)
                for ref in ready:
                    _finish(ray, ref, running.pop(ref))
                    bar.update()
                if ready or _cpus(ray) >= cpus:
                    waiting_since = None
                    continue
                waiting_since = waiting_since or time.monotonic()
                if time.monotonic() - waiting_since > NO_NODE_TIMEOUT:
                    _no_node(ray, list(running.values()) + queue, cpus)
                    return
        finally:
            for ref in running:  # interrupted: nothing left running on the cluster
                ray.cancel(ref, force=True)


def _task(compute: Callable, cell) -> tuple:
    """On a node: the computed cell, and where it ran."""
    import ray
    return compute(cell), ray.util.get_node_ip_address()


def _finish(ray, ref, cell) -> None:
    """The result of a finished task onto the driver's ``cell``; a failed task makes a failed cell."""
    try:
        computed, node = ray.get(ref, timeout=FETCH_TIMEOUT)
    except ray.exceptions.RayError as e:
        _failed(cell, f'lost: {_reason(e)}; after {RETRIES} retries it is left for the next run of the same command')
        return
    cell.status, cell.error, cell.problems, cell.result = computed.status, computed.error, computed.problems, \
        computed.result
    logger.info('cell %s: %s on node %s', cell.name, cell.status, node)


def _failed(cell, error: str) -> None:
    cell.status, cell.error, cell.result = 'failed', error, None
    logger.error('cell %s failed: %s', cell.name, error)


def _reason(error: Exception) -> str:
    """The first line of a Ray error, with its type."""
    lines = [line for line in str(error).splitlines() if line.strip()]
    return f'{type(error).__name__}: {lines[0] if lines else ""}'.rstrip(': ')


def _cpus(ray) -> float:
    """The most CPUs one live node of the cluster offers (0 while the cluster cannot be asked)."""
    try:
        return max([n.get('Resources', {}).get('CPU', 0) for n in ray.nodes() if n.get('Alive')], default=0)
    except Exception:  # the head is being reached again: no CPU known, the bound goes on counting
        return 0


def _no_node(ray, cells: List, cpus: int) -> None:
    """Fails the cells left, none of which any live node could take for :data:`NO_NODE_TIMEOUT` seconds."""
    error = (f'no live node of the cluster offered the {cpus} CPU(s) a cell needs for {NO_NODE_TIMEOUT} s (the '
             f'largest offers {_cpus(ray):g}): start nodes with --num-cpus={cpus} or more (ray start '
             '--address=HEAD:PORT), or lower --workers, then re-run the same command')
    for cell in cells:
        _failed(cell, error)
