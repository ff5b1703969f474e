"""Pruned retrieval over a sharded index: one :class:`~pyterrier_rdime.PrunedRetriever` per shard, each in its own Ray
actor, queried at once; their exact top-k merged into the exact global top-k (:func:`merge_shards`); the shards cut
from one FlexIndex by :func:`split_flex_index`. Ray is imported on first use only."""
import contextlib
import functools
import json
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from .. import store
from .._config import check_int, check_positive
from . import calibration, kept, planner
from .dense import best_k
from .layout import docno_hashes, shared_hashes
from .planner import Choice, CostModel, MeasuredChoice, Plan
from .stage import ExactRetriever, PrunedRetriever

#: Seconds between two checks that a late shard's actor still answers (a call answered sooner pays no check).
PROBE_EVERY = 1.0
#: Candidate pairs of shared docno hashes whose docnos are fetched and compared at a time.
DOCNO_PAIRS = 1024
#: Seconds to wait for the cluster's table of resource requests (a GCS call) before the call fails.
GCS_TIMEOUT = 30
#: Documents copied per block by :func:`split_flex_index` (``block x dims x 4`` bytes of memory).
SPLIT_BLOCK = 65536
#: HTTP/2 connection preface and empty SETTINGS frame: Ray's GCS (gRPC) answers with SETTINGS, a non-Ray service not.
HTTP2_PREFACE = b'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n' + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
#: The type byte of an HTTP/2 SETTINGS frame (after its 3 bytes of length).
SETTINGS_FRAME = 4

logger = logging.getLogger(__name__)


class ShardServer:
    """What a Ray actor of :class:`ShardedPrunedRetriever` runs: one shard's ``PrunedRetriever`` on ``threads``
    threads (None: every core). Replies name its node, so that an error after a restart names where the shard was."""

    def __init__(self, retriever: PrunedRetriever, threads: Optional[int]):
        import ray
        self.retriever = retriever
        self.node = (ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address())
        self.threads = threads or os.cpu_count()
        if kept.NUMBA_AVAILABLE:
            import numba
            self.threads = min(self.threads, numba.config.NUMBA_NUM_THREADS)
        # BLAS on as many threads as the kernel, not on the one thread Ray's OMP_NUM_THREADS gives an actor
        with contextlib.suppress(ImportError):
            from threadpoolctl import threadpool_limits
            self._limits = threadpool_limits(self.threads, user_api='blas')

    def _use_threads(self) -> None:
        """Set numba's threads: the setting is per thread, and Ray runs methods on another thread than ``__init__``."""
        if kept.NUMBA_AVAILABLE:
            import numba
            numba.set_num_threads(self.threads)

    def where(self) -> Tuple[str, str]:
        """``(node ID, IP address)``, asked on the ``'probe'`` thread to tell a slow shard from a lost one."""
        return self.node

    def info(self) -> Tuple[Tuple[str, str], int, np.ndarray, bool, bool, int, int]:
        """``(node, documents, abs max per dimension, compiled kernels here, float32 pruned paths plannable, bytes of
        float32 vectors in files (0: an array), the node's memory)``."""
        self._use_threads()
        retriever = self.retriever
        dims, docs = retriever.shape
        return (self.node, docs, retriever._layout.abs_max(), kept.NUMBA_AVAILABLE,
                retriever.strategy != 'auto' or retriever._layout.has_matrix(),
                0 if retriever._layout.is_array else 4 * dims * docs, store.memory_bytes())

    def cost_model(self) -> CostModel:
        """This node's cost model (calibrated on first use), from which the driver plans."""
        self._use_threads()  # the model is calibrated, and cached, for the threads the searches use
        return calibration.model()

    def docno_hashes(self) -> np.ndarray:
        """The shard's docno hashes, sorted, for the driver to compare across shards."""
        self._hashes = docno_hashes(self.retriever._layout.lookup_docnos, self.retriever.shape[1])
        return np.sort(self._hashes)

    def docnos_hashed(self, values: np.ndarray) -> List[str]:
        """The docnos of the documents whose docno hash (by :meth:`docno_hashes`) is one of ``values``."""
        return [str(d) for d in self.retriever._layout.lookup_docnos(np.flatnonzero(np.isin(self._hashes, values)))]

    def search(self, query_vecs: np.ndarray, k: int, plan: Plan) -> tuple:
        """Each query's exact top-``k`` in this shard on ``plan``, flat: ``(node, documents, counts, scores, local
        docids, docnos)``."""
        self._use_threads()
        retriever = self.retriever.fuse_rank_cutoff(k) or self.retriever
        scores, docids = retriever.search(query_vecs, plan)
        flat = np.concatenate(docids).astype(np.int64)
        docnos = np.asarray(self.retriever._layout.lookup_docnos(flat), dtype=str)
        return (self.node, self.retriever.shape[1], np.array([len(d) for d in docids]), np.concatenate(scores),
                flat, docnos)


class _Actors:
    """The actors of a retriever and its ``% k`` variants (``handles`` None until started) with the shards they
    serve; once started, :meth:`ShardedPrunedRetriever._start` adds what the plan and the merge need (``docs``,
    ``offsets``, ``dims``, ``abs_max``, ``compiled``, ``float32_ready``, ``out_of_core``) and ``retrievers`` (each
    actor's retriever in the object store, for a restart to read)."""

    def __init__(self, handles: Optional[list] = None, served: Sequence[int] = ()):
        self.lock = threading.Lock()
        self.handles = handles
        self.served = list(served)
        self.nodes: List[Tuple[str, str]] = [('', '')] * len(self.served)
        self.model: Optional[CostModel] = None


def nodes_out_of_core(nodes: Sequence[Tuple[str, str]], file_bytes: Sequence[int], memory: Sequence[int]) -> bool:
    """Whether the float32 files of the shards on some node, together, are :func:`.store.out_of_core` of its memory
    (the planner's ``out_of_core``): each actor reports its shard's bytes and its node's memory."""
    on_node: Dict[Tuple[str, str], int] = {}
    for node, nbytes in zip(nodes, file_bytes):
        on_node[node] = on_node.get(node, 0) + nbytes
    node_memory = dict(zip(nodes, memory))
    return any(store.out_of_core(nbytes, node_memory[node]) for node, nbytes in on_node.items())


def _queued_requests(ray) -> List[Dict[str, float]]:
    """The resource shapes of the requests waiting in the cluster's queues for a node (as ``ray status`` shows)."""
    usage = ray._private.worker.global_worker.gcs_client.get_all_resource_usage(timeout=GCS_TIMEOUT)
    return [dict(d.shape) for d in usage.resource_usage_data.resource_load_by_shape.resource_demands
            if d.num_ready_requests_queued or d.num_infeasible_requests_queued or d.backlog_size]


class ShardedPrunedRetriever(ExactRetriever):
    """:class:`~pyterrier_rdime.PrunedRetriever` over an index split into shards, one Ray actor per shard: the same
    output as one ``PrunedRetriever`` over the whole collection (a document's ``docid`` is its position in the shards'
    order), for an index larger than one machine. A batch is checked and planned once, on the driver (under ``'auto'``
    measured on the driver's own calls), sent to every shard, and the shards' exact top-k merged (exact ties to the
    lower global docid). Placement, faults, start-up, CPUs and docno checks: pt_docs/pruned.rst, "Beyond one machine";
    use it in a ``with`` block or :meth:`close` it.

    Args:
        shards: in global document order, FlexIndexes or ``(docs, dims)`` arrays of one dimensionality.
        num_results, docnos, strategy, batch_size, drop_query_vec, verbose: as ``PrunedRetriever``.
        ray_address: ``None`` starts Ray here, ``'auto'`` joins this machine's cluster, or ``'host:port'``.
        num_cpus, resources: the CPUs each actor reserves (and its threads; ``None``: none, every core), and per shard
            the custom Ray resources that pin its actor to a node.
        max_restarts: restarts of a dead actor (each re-sends the batch it was serving) before the call fails.
        timeout, start_timeout: seconds a call waits for a shard's actor to be placed on a node (then fails, naming
            that shard), and for one placed but still starting (a warning once ``timeout`` has passed).

    Input columns: ``qid, query_vec``. Output columns: the input's plus ``docno, docid, score, rank``. Example::

        shards = split_flex_index(pyterrier_dr.FlexIndex('msmarco.flex'), 'msmarco-shards', 4)
        with ShardedPrunedRetriever(shards=shards, num_results=1000) as retriever:  # ray_address='auto' on a cluster
            pipe = bm25 % 10 >> model.query_encoder() >> index.vec_loader() >> PrfDime(keep_ranking=False) \\
                >> Rdime() >> retriever
    """
    schematic = {'label': 'ShardedPruned'}
    _shared = ('_retrievers', '_actors', '_measured')

    def __init__(self, *, shards: Sequence[object], num_results: int = 1000, docnos: Optional[Sequence[str]] = None,
                 strategy: str = 'auto', batch_size: int = 64, drop_query_vec: bool = False,
                 ray_address: Optional[str] = None, num_cpus: Optional[float] = None,
                 resources: Optional[Sequence[Mapping[str, float]]] = None, max_restarts: int = 3,
                 timeout: float = 60, start_timeout: float = 600, verbose: bool = False):
        name = type(self).__name__
        if isinstance(shards, (np.ndarray, str)) or not isinstance(shards, Sequence) or not len(shards):
            raise ValueError(f'{name}: shards must be a non-empty list of FlexIndexes or (docs, dims) arrays, got '
                             f'{type(shards).__name__}; for one index use PrunedRetriever')
        if num_cpus is not None:
            check_positive(name, 'num_cpus', num_cpus, "the CPUs (and threads) of each shard's actor, or None")
        check_int(name, 'max_restarts', max_restarts, 0)
        check_positive(name, 'timeout', timeout, 'the seconds a call waits for a shard without a node')
        check_positive(name, 'start_timeout', start_timeout, "the seconds a call waits for a placed actor to start")
        if ray_address is not None and not isinstance(ray_address, str):
            raise ValueError(f"{name}: ray_address must be None, 'auto' or 'host:port', got {ray_address!r}")
        if resources is not None and (len(resources) != len(shards)
                                      or not all(isinstance(r, Mapping) for r in resources)):
            raise ValueError(f'{name}: resources must hold one dict of Ray resources per shard ({len(shards)}), '
                             f'got {resources!r}')
        arrays = [s for s in shards if isinstance(s, np.ndarray)]
        if arrays and any(hasattr(s, 'index_path') for s in shards):
            raise ValueError(f'{name}: shards must be all FlexIndexes or all arrays, not both (the docids of an array '
                             "shard would depend on the FlexIndexes' sizes); write the arrays into FlexIndexes")
        if docnos is not None and len(arrays) != len(shards):
            raise ValueError(f'{name}: docnos is only for array shards; a FlexIndex has its own docnos')
        if any(a.ndim != 2 for a in arrays) or len({a.shape[1] for a in arrays}) > 1:
            raise ValueError(f'{name}: array shards must be (docs, dims) matrices of one dimensionality, got shapes '
                             f'{[a.shape for a in arrays]}')
        if arrays and len(arrays) == len(shards) and not sum(len(a) for a in arrays):
            raise ValueError(f'{name}: every shard is empty')
        if docnos is not None and len(docnos) != sum(len(a) for a in arrays):
            raise ValueError(f'{name}: docnos has {len(docnos)} entries but the shards hold '
                             f'{sum(len(a) for a in arrays)} rows')
        self._keep_arguments(locals())
        self._retrievers = self._shard_retrievers()
        self._actors = _Actors()
        self._measured = MeasuredChoice(None)  # the driver's timings of its calls, in memory (see .planner)

    def _shard_retrievers(self) -> List[Optional[PrunedRetriever]]:
        """Each shard's ``PrunedRetriever`` (None for an empty array), which checks the shard and the options
        (``drop_query_vec`` and ``verbose`` too)."""
        retrievers, row = [], 0
        for i, shard in enumerate(self.shards):
            docnos = None
            if isinstance(shard, np.ndarray):
                if not len(shard):
                    retrievers.append(None)
                    continue
                docnos = (self.docnos[row:row + len(shard)] if self.docnos is not None else
                          [str(d) for d in range(row, row + len(shard))])
                row += len(shard)
            try:
                retrievers.append(PrunedRetriever(index=shard, num_results=self.num_results, docnos=docnos,
                                                  strategy=self.strategy, batch_size=self.batch_size,
                                                  drop_query_vec=self.drop_query_vec, verbose=self.verbose))
            except ValueError as e:
                raise ValueError(f'{type(self).__name__}: shard {i}: {e}') from None
        return retrievers

    def _identity(self) -> dict:
        # shards and resources are lists: compared by what they hold (FlexIndexes by path), not as list objects
        identity = super()._identity()
        identity['shards'] = repr([str(s.index_path) if hasattr(s, 'index_path') else id(s) for s in self.shards])
        identity['resources'] = repr(self.resources)
        return identity

    def __getstate__(self) -> dict:
        # actor handles belong to this process's Ray connection: a copy starts its own
        return {**self.__dict__, '_actors': None, '_retrievers': None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._retrievers = self._shard_retrievers()
        self._actors = _Actors()

    def _rank(self, inp: pd.DataFrame) -> tuple:
        ray, actors = self._start()
        query_vecs = PrunedRetriever.stack_queries(inp, actors.dims, actors.abs_max, type(self).__name__)
        # a first share of the call may explore a path, the rest chosen again (planner.parts)
        found = [self._rank_part(ray, actors, part, choice) for choice, part in planner.parts(query_vecs, self.choice)]
        scores, docids, docnos = ([x for part in found for x in part[j]] for j in range(3))
        return scores, docids, lambda _: np.concatenate(docnos).astype(object)

    def _rank_part(self, ray, actors: _Actors, query_vecs: np.ndarray, choice: Choice) -> Tuple[list, list, list]:
        replies = self._measured.timed(choice, functools.partial(self._search, ray, actors, query_vecs, choice.plan))
        per_shard = []
        for position, (shard, docs, offset, (node, now, counts, scores, docids, docnos)) in enumerate(zip(
                actors.served, actors.docs, actors.offsets, replies)):
            actors.nodes[position] = node  # where it answered from: another node after a restart
            if now != docs:
                raise RuntimeError(f'{type(self).__name__}: {self._shard(shard)} now holds {now} documents, {docs} '
                                   'when it started (its actor restarted on a changed index): the global docids no '
                                   'longer hold; build a new retriever')
            per_shard.append((np.concatenate([[0], np.cumsum(counts)]), scores, docids + offset, docnos))
        return merge_shards(per_shard, len(query_vecs), self.num_results)

    def choice(self, query_vecs: np.ndarray, call_bucket: Optional[str] = None) -> Choice:
        """How every shard scores these pruned query vectors, and why: :func:`.planner.choose` for the whole
        collection, with the first shard's node's cost model."""
        ray, actors = self._start()
        total = int(np.sum(actors.docs))

        def model() -> CostModel:
            if actors.model is None:  # calibrated on the first shard's node, where the shards run, not here
                actors.model = self._gather(ray, actors, lambda handle: handle.cost_model.remote(), 'calibrate',
                                            first_only=True)[0]
            return actors.model
        return planner.choose(query_vecs, strategy=self.strategy, matrix_bytes=total * actors.dims * 4,
                              compiled=actors.compiled, model=model, k=min(self.num_results, total),
                              float32_ready=actors.float32_ready, timings=self._measured, call_bucket=call_bucket,
                              out_of_core=actors.out_of_core)

    def _search(self, ray, actors: _Actors, query_vecs: np.ndarray, plan: Plan) -> list:
        """Every shard's reply to the search of these queries on ``plan``'s path."""
        batch = ray.put(query_vecs)  # sent once, read by every shard from the object store
        return self._gather(ray, actors, lambda handle: handle.search.remote(batch, self.num_results, plan), 'search')

    def close(self) -> None:
        """Release the actors of this retriever and its ``% k`` variants, returning once Ray says they are gone (a
        warning after ``timeout``); a later call starts new ones."""
        actors = self._actors
        with actors.lock:
            if actors.handles is not None:
                import ray
                for handle in actors.handles:
                    ray.kill(handle, no_restart=True)
                self._wait_until_gone(ray, actors.handles)
                actors.handles = None
                actors.retrievers = []
                actors.model = None

    def _wait_until_gone(self, ray, handles: list) -> None:
        """Ask each killed actor where it is until Ray answers that it is gone: ``ray.kill`` returns before the
        actor's process ends, and a call sent meanwhile may still be answered (and its CPUs still held)."""
        deadline = time.monotonic() + self.timeout
        alive = list(handles)
        while alive and time.monotonic() < deadline:
            pings = [handle.where.options(concurrency_group='probe').remote() for handle in alive]
            done, _ = ray.wait(pings, num_returns=len(pings), timeout=max(0.0, deadline - time.monotonic()))
            still_alive = []
            for handle, ping in zip(alive, pings):
                try:
                    if ping in done:  # one not done by the deadline is alive as far as anyone can tell
                        ray.get(ping)
                    still_alive.append(handle)
                except ray.exceptions.RayActorError:
                    pass
            alive = still_alive
            if alive:
                time.sleep(0.05)
        if alive:
            logger.warning('%s: %d actor(s) still answered timeout=%s s after close() killed them; Ray frees their '
                           'CPUs when their processes end', type(self).__name__, len(alive), self.timeout)

    def __enter__(self) -> 'ShardedPrunedRetriever':
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _start(self):
        """Ray and the running actors (started and checked on first use)."""
        name = type(self).__name__
        try:
            import ray
        except ImportError:
            raise ImportError(f"{name} needs Ray: pip install 'pyterrier-rdime[ray]' (from a clone: pip install "
                              "'.[ray]')") from None
        actors = self._actors
        with actors.lock:
            if actors.handles is None:
                connect(self.ray_address, self.timeout, f'{name}: ray_address')
                served = [i for i, r in enumerate(self._retrievers) if r is not None]
                # a thread of its own answers where the actor is while it searches
                server = ray.remote(concurrency_groups={'probe': 1})(ShardServer)
                threads = None if self.num_cpus is None else max(1, int(self.num_cpus))
                # Ray lets go of an actor's arguments once it has started: a restart would not find them
                retrievers = [ray.put(self._retrievers[i]) for i in served]
                handles = [server.options(num_cpus=self.num_cpus or 0, max_restarts=self.max_restarts,
                                          max_task_retries=self.max_restarts,
                                          resources=dict(self.resources[i]) if self.resources else None,
                                          ).remote(ref, threads)
                           for i, ref in zip(served, retrievers)]
                starting = _Actors(handles, served)
                try:
                    self._wait_placed(ray, starting)
                    nodes, docs, abs_maxes, compiled, ready, file_bytes, memory = zip(*self._gather(
                        ray, starting, lambda handle: handle.info.remote(), 'open'))
                    if len({len(a) for a in abs_maxes}) > 1:
                        other = next(i for i, a in zip(served, abs_maxes) if len(a) != len(abs_maxes[0]))
                        raise ValueError(f'{name}: {self._shard(served[0])} holds {len(abs_maxes[0])}-dimensional '
                                         f'vectors but {self._shard(other)} holds {len(abs_maxes[served.index(other)])}'
                                         '; every shard needs vectors of the same model')
                    self._refuse_shared_docnos(ray, starting)
                except BaseException:
                    for handle in handles:  # a retriever that failed to start holds nothing
                        ray.kill(handle, no_restart=True)
                    raise
                actors.docs = np.array(docs)  # the shards not served are empty
                actors.offsets = np.cumsum(actors.docs) - actors.docs
                actors.dims = len(abs_maxes[0])
                actors.abs_max = np.max(abs_maxes, axis=0)
                actors.compiled = all(compiled)
                actors.float32_ready = all(ready)
                actors.out_of_core = nodes_out_of_core(nodes, file_bytes, memory)
                actors.served, actors.retrievers, actors.nodes = served, retrievers, list(nodes)
                actors.handles = handles
        return ray, actors

    def _wait_placed(self, ray, actors: _Actors) -> None:
        """Wait until every actor runs; fail naming a shard that found no node in ``timeout`` or did not start in
        ``start_timeout``."""
        ready = [h.__ray_ready__.remote() for h in actors.handles]
        started = last = time.monotonic()
        pending = set(range(len(ready)))
        waiting_since: Dict[int, float] = {}  # shard -> since when its request has waited for a node
        warned = False
        while pending:
            done, _ = ray.wait([ready[i] for i in pending], num_returns=len(pending), timeout=PROBE_EVERY)
            for i in sorted(i for i in pending if ready[i] in done):
                self._reply(ray, actors.served[i], ready[i], 'start')
                pending.discard(i)
            if not pending:
                return
            now, queued = time.monotonic(), _queued_requests(ray)
            shards = [actors.served[i] for i in sorted(pending)]
            for shard in shards:
                if self._shape(shard) in queued:
                    waiting_since.setdefault(shard, last)
                else:
                    waiting_since.pop(shard, None)
            last = now
            late = [shard for shard in shards if now - waiting_since.get(shard, now) > self.timeout]
            if late:
                shard = next((s for s in late if not self._offering(ray, s)), late[0])
                nodes = len(self._offering(ray, shard))
                offered = (f'{nodes} live node(s) offer them, all reserved by other actors or tasks (a retriever not '
                           'yet closed holds its num_cpus)' if nodes else 'no live node offers them')
                raise RuntimeError(f'{type(self).__name__}: the actor of {self._shard(shard)} found no '
                                   f'node with {self._wanted(shard)} free in timeout={self.timeout} s ({offered}; '
                                   f'the cluster has {ray.available_resources()} free): lower num_cpus, start nodes '
                                   "with those resources (ray start --resources='{...}'), close() the retrievers that "
                                   'hold them, or fix resources=')
            starting = [shard for shard in shards if shard not in waiting_since]
            if starting and now - started > self.start_timeout:
                raise RuntimeError(f'{type(self).__name__}: the actors of shards {starting} had a node but did not '
                                   f'start in start_timeout={self.start_timeout} s (Ray starts a worker process for '
                                   "each, slowly on a loaded machine): raise start_timeout, or lighten the nodes' load")
            if starting and not warned and now - started > self.timeout:
                warned = True
                logger.warning('%s: the actors of shards %s have a node but have not started after timeout=%s s (Ray '
                               'is starting their worker processes, slowly on a loaded machine); waiting for them up '
                               'to start_timeout=%s s', type(self).__name__, starting, self.timeout, self.start_timeout)

    def _shape(self, shard: int) -> Dict[str, float]:
        """:meth:`_wanted` as Ray's queue lists it (no zeros)."""
        return {name: float(value) for name, value in self._wanted(shard).items() if value}

    def _offering(self, ray, shard: int) -> List[dict]:
        """The live nodes whose resources (free or not) cover what the actor of ``shard`` asks."""
        return [n for n in ray.nodes() if n.get('Alive')
                and all(n.get('Resources', {}).get(r, 0) >= v for r, v in self._wanted(shard).items())]

    def _refuse_shared_docnos(self, ray, actors: _Actors) -> None:
        """Fail naming a docno that two shards hold; only docnos whose hashes two shards share are fetched."""
        hashes = self._gather(ray, actors, lambda handle: handle.docno_hashes.remote(), 'hash its docnos')
        shared = shared_hashes(hashes)
        for start in range(0, len(shared), DOCNO_PAIRS):
            values = shared[start:start + DOCNO_PAIRS]
            docnos = self._gather(ray, actors, lambda handle: handle.docnos_hashed.remote(values), 'look up docnos')
            first = {}
            for shard, names in zip(actors.served, docnos):
                for docno in names:
                    if docno in first:
                        raise ValueError(
                            f'{type(self).__name__}: docno {docno!r} is in {self._shard(first[docno])} and in '
                            f'{self._shard(shard)}, so a ranking could hold it twice; put each document in one '
                            'shard only (split_flex_index cuts one index into shards that share none)')
                    first[docno] = shard

    def _gather(self, ray, actors: _Actors, send: Callable[[object], object], what: str,
                first_only: bool = False) -> list:
        """Every actor's reply to ``send(handle)`` (the first's only with ``first_only``), or an error naming the
        first shard that failed. A late actor is probed: one that answers is working (no bound); one that does not
        is waited for up to ``timeout`` (``start_timeout`` while Ray restarts it). Unavailable actors are re-sent."""
        count = 1 if first_only else len(actors.handles)
        futures = [send(handle) for handle in actors.handles[:count]]
        sent = [time.monotonic()] * count
        replies: list = [None] * count
        pending = set(range(count))
        probes: dict = {}  # position -> (probe future, when it was sent)
        silent_since: dict = {}  # position -> when its actor was first found without a node
        warned: set = set()  # positions whose actor was said to be starting
        while pending:
            done, _ = ray.wait([futures[i] for i in pending], num_returns=len(pending), timeout=PROBE_EVERY)
            for i in [i for i in pending if futures[i] in done]:
                try:
                    replies[i] = self._reply(ray, actors.served[i], futures[i], what)
                    pending.discard(i)
                except ray.exceptions.ActorUnavailableError:
                    silent_since.setdefault(i, sent[i])
                    # no faster than Ray's own retries, which come first (max_task_retries)
                    time.sleep(max(0.0, sent[i] + PROBE_EVERY - time.monotonic()))
                    futures[i], sent[i] = send(actors.handles[i]), time.monotonic()
            now = time.monotonic()
            for i in pending:
                probe, asked = probes.pop(i, (None, now))
                if probe is None:
                    probes[i] = (actors.handles[i].where.options(concurrency_group='probe').remote(), now)
                elif ray.wait([probe], timeout=0)[0]:
                    try:
                        actors.nodes[i] = ray.get(probe)
                        silent_since.pop(i, None)  # it answers: it is working, however long it takes
                    except ray.exceptions.ActorUnavailableError:
                        silent_since.setdefault(i, asked)
                    except ray.exceptions.RayError:
                        pass  # the actor died: the reply of its call says so
                else:
                    silent_since.setdefault(i, asked)
                    probes[i] = (probe, asked)
                if i in silent_since and now - silent_since[i] > self.timeout:
                    if self._shape(actors.served[i]) in _queued_requests(ray):
                        self._no_node(ray, actors, i)
                    if now - silent_since[i] > self.start_timeout:
                        self._no_node(ray, actors, i, starting=True)
                    if i not in warned:
                        warned.add(i)
                        logger.warning('%s: the actor of shard %s has not answered for timeout=%s s but waits for no '
                                       'node (Ray is starting it again, slowly on a loaded machine); waiting for it '
                                       'up to start_timeout=%s s', type(self).__name__, actors.served[i],
                                       self.timeout, self.start_timeout)
        return replies

    def _reply(self, ray, shard: int, future: object, what: str) -> object:
        """One shard's reply, or an error naming the shard (ActorUnavailableError passes through, to re-send)."""
        try:
            return ray.get(future)
        except ray.exceptions.RayTaskError as e:
            cause = e.cause if isinstance(e.cause, Exception) else e
            kind = ValueError if isinstance(cause, ValueError) else RuntimeError
            raise kind(f'{type(self).__name__}: {self._shard(shard)} failed to {what}: {cause}') from e
        except ray.exceptions.ActorUnavailableError:
            raise
        except ray.exceptions.RayError as e:
            raise RuntimeError(f'{type(self).__name__}: the actor of {self._shard(shard)} died and could not be '
                               f'recovered (max_restarts={self.max_restarts}): {e}') from e

    def _no_node(self, ray, actors: _Actors, position: int, starting: bool = False) -> None:
        """Fail for a shard whose actor had no node for ``timeout`` (``starting``: silent for ``start_timeout``)."""
        shard = actors.served[position]
        node_id, address = actors.nodes[position]
        wanted = self._wanted(shard)
        lost = not any(n['NodeID'] == node_id for n in ray.nodes() if n.get('Alive'))
        offered = bool(self._offering(ray, shard))
        last = f'node {node_id[:12]} ({address})' if node_id else 'its node'
        state = 'lost' if lost else 'alive but does not answer'
        silent = (f'has not answered for start_timeout={self.start_timeout} s, though no node was missing (Ray was '
                  'starting it, or it hangs)' if starting else f'has had no node for timeout={self.timeout} s')
        raise RuntimeError(
            f'{type(self).__name__}: the actor of {self._shard(shard)} {silent}; it was last on {last}, which is '
            f'{state}, and {"some" if offered else "no"} live node offers {wanted}. Start a node that offers them '
            f"(ray start --address=HEAD:PORT --resources='{{...}}') with the shard's files, or put the shard on a file "
            'system every node reads and leave its resources out; then call again (or build a new retriever)')

    def _wanted(self, shard: int) -> dict:
        """What the actor of ``shard`` asks of a node."""
        return {'CPU': self.num_cpus or 0, **(self.resources[shard] if self.resources else {})}

    def _shard(self, shard: int) -> str:
        """``shard`` and where it is, for an error message."""
        index = self.shards[shard]
        if isinstance(index, np.ndarray):
            return f'shard {shard} (an array of {index.shape[0]} x {index.shape[1]})'
        return f'shard {shard} ({index.index_path})'


def check_ray_address(address: Optional[str], timeout: float, option: str) -> None:
    """Fail in one line naming ``option`` unless ``address`` (``'host:port'`` or ``'auto'``) answers as a Ray GCS
    within ``timeout`` seconds (``ray.init`` would retry for minutes). ``None``/``'local'`` pass; ``'ray://'`` or
    TLS addresses need only accept a connection."""
    if address in (None, 'local'):
        return
    fix = ("pass the Ray head node's 'host:port' (the address ray start --head prints), 'auto' on a node of the "
           "cluster, or 'local' to start Ray on this machine")
    if address == 'auto':
        from ray._private.services import canonicalize_bootstrap_address
        try:
            resolved = canonicalize_bootstrap_address('auto')
        except ConnectionError:
            raise ConnectionError(f"{option} auto: this machine belongs to no Ray cluster (none was started here with "
                                  "ray start, and RAY_ADDRESS is not set): start one (ray start --head), or pass the "
                                  "head node's 'host:port', or 'local' to start Ray on this machine") from None
        where = f"'auto' (the cluster at {resolved})"
    else:
        resolved, where = address, repr(address)
    host, _, port = resolved.split('://')[-1].rpartition(':')
    try:
        conn = socket.create_connection((host, int(port)), timeout=timeout)
    except (OSError, ValueError) as e:
        raise ConnectionError(f'{option}: no Ray cluster answers at {where} ({e or type(e).__name__}, timeout='
                              f'{timeout} s): start one there (ray start --head), or {fix}') from None
    with conn:
        if resolved.startswith('ray://') or os.environ.get('RAY_USE_TLS', '0').lower() not in ('0', 'false'):
            return  # Ray Client's protocol, or a GCS behind TLS: the connection is what can be checked here
        reply, deadline = b'', time.monotonic() + timeout
        with contextlib.suppress(OSError):  # a timeout, or a reset: what came so far is the answer
            conn.sendall(HTTP2_PREFACE)
            while len(reply) < 4 and time.monotonic() < deadline:
                conn.settimeout(max(0.01, deadline - time.monotonic()))
                chunk = conn.recv(64)
                if not chunk:
                    break
                reply += chunk
    if len(reply) < 4 or reply[3] != SETTINGS_FRAME:
        said = f'it answered {reply[:40]!r}' if reply else f'it sent nothing back within timeout={timeout} s'
        raise ConnectionError(f'{option}: the service at {where} accepts connections but is not a Ray cluster (a '
                              f"Ray cluster's GCS answers gRPC; {said}): {fix}")


def connect(address: Optional[str], timeout: float, option: str) -> None:
    """Connect to the Ray cluster at ``address`` (``None`` starts Ray here) unless connected, failing in one line."""
    import ray
    if not ray.is_initialized():
        check_ray_address(address, timeout, option)
        try:
            ray.init(address=address)
        except ConnectionError as e:
            raise ConnectionError(f'{option}: could not connect to the Ray cluster at {address!r}: {e}') from e


def merge_shards(per_shard: List[Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]], queries: int,
                 k: int) -> Tuple[list, list, list]:
    """``(scores, docids, docnos)``: each query's global top-``k`` from each shard's ``(bounds, scores, global
    docids, docnos)``, ties to the lower global docid."""
    merged: Tuple[list, list, list] = ([], [], [])
    for q in range(queries):
        parts = [np.concatenate([shard[j][b[q]:b[q + 1]] for b, *shard in per_shard]) for j in range(3)]
        order = best_k(parts[0], parts[1], k)
        for out, part in zip(merged, parts):
            out.append(part[order])
    return merged


def split_flex_index(index: object, folder: str, num_shards: int) -> List[object]:
    """Cut a FlexIndex into ``num_shards`` FlexIndexes of consecutive document ranges, written atomically to
    ``folder/shard-<i>-of-<n>.flex``, in order: ``ShardedPrunedRetriever`` over them ranks as ``PrunedRetriever``
    over ``index``.

    Raises:
        ValueError: ``num_shards`` is not between 1 and the number of documents, or a shard's folder exists.
    """
    import npids
    docnos, meta = index.payload(return_dvecs=False)
    docs, dims = int(meta['doc_count']), int(meta['vec_size'])
    check_int('split_flex_index', 'num_shards', num_shards, 1)
    if num_shards > docs:
        raise ValueError(f'split_flex_index: num_shards={num_shards} is more than the {docs} documents of {index!r}')
    bounds = [docs * i // num_shards for i in range(num_shards + 1)]
    paths = [Path(folder) / f'shard-{i}-of-{num_shards}.flex' for i in range(num_shards)]
    existing = [str(p) for p in paths if p.exists()]
    if existing:
        raise ValueError(f'split_flex_index: {existing[0]} exists; remove it, or pass another folder')
    row_bytes = dims * 4
    with open(Path(index.index_path) / 'vecs.f4', 'rb') as source:
        for path, start, stop in zip(paths, bounds, bounds[1:]):
            tmp = path.with_name(f'.{path.name}.tmp')
            tmp.mkdir(parents=True, exist_ok=True)
            with open(tmp / 'vecs.f4', 'wb') as out:
                source.seek(start * row_bytes)
                for block in range(start, stop, SPLIT_BLOCK):
                    out.write(source.read((min(stop, block + SPLIT_BLOCK) - block) * row_bytes))
            npids.Lookup.build(iter(docnos.fwd[np.arange(start, stop)].tolist()), tmp / 'docnos.npids')
            (tmp / 'pt_meta.json').write_text(json.dumps({**meta, 'vec_size': dims, 'doc_count': stop - start}))
            os.replace(tmp, path)
    return [type(index)(str(path), sim_fn=index.sim_fn, verbose=index.verbose) for path in paths]
