"""ShardedPrunedRetriever on a real local Ray cluster of three nodes (started once for the module): the same ranking as
one PrunedRetriever over the whole collection for every query and every k, ties across shards included, an empty shard
and shards smaller than k, every shard on the plan of the whole collection, FlexIndex shards cut by split_flex_index
and placed on nodes by custom resources, an actor killed mid-batch recovered and then, its restarts spent, reported, a
node lost (a pinned shard reported within the timeout, an unpinned one recovered elsewhere), docnos shared by two
shards refused, a wrong address, close() and what num_cpus holds, a shard changed under its actor refused,
pickling / repr / equality, and bad inputs."""
import logging
import os
import pickle
import socket
import sys
import time
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from pruned_data import DIMS, K, flex_index, make_corpus, query_frame

from pyterrier_rdime import PrunedRetriever, ShardedPrunedRetriever, split_flex_index
from pyterrier_rdime.pruned import calibration, planner, sharded
from pyterrier_rdime.pruned.planner import Plan

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings('ignore::DeprecationWarning')]


SMALL_NODE = {'num_cpus': 1, 'object_store_memory': 80 * 2 ** 20}


@pytest.fixture(scope='module')
def local_cluster():
    """A head node and two worker nodes, each offering a custom resource that names it (the Cluster, to add and
    remove nodes)."""
    ray = pytest.importorskip('ray', reason='ray is not installed: pip install pyterrier-rdime[ray]')
    from ray.cluster_utils import Cluster
    os.environ.setdefault('RAY_USAGE_STATS_ENABLED', '0')
    local = Cluster(initialize_head=True, head_node_args={**SMALL_NODE, 'include_dashboard': False,
                                                          'resources': {'node-head': 1}})
    for name in ('node-a', 'node-b'):
        local.add_node(**SMALL_NODE, resources={name: 1})
    ray.init(address=local.address, log_to_driver=False, configure_logging=False)
    yield local
    ray.shutdown()
    local.shutdown()


@pytest.fixture(scope='module')
def cluster(local_cluster):
    """Ray, connected to the local cluster."""
    import ray
    return ray


@pytest.fixture(scope='module')
def corpus():
    return make_corpus()


def assert_same_ranking(out: pd.DataFrame, expected: pd.DataFrame, exact: bool = True) -> None:
    """The same documents in the same order and the same scores, or (``exact=False``: BLAS sums a block of documents
    in an order that depends on the matrix's width) scores within float32 rounding, documents that close swapped
    among themselves."""
    assert list(out.columns) == list(expected.columns)
    for column in ('qid', 'rank') + (('docno', 'docid') if exact else ()):
        assert out[column].tolist() == expected[column].tolist(), column
    if exact:
        np.testing.assert_array_equal(out['score'].to_numpy(), expected['score'].to_numpy())
    else:  # documents whose scores are that close may swap ranks, among themselves
        np.testing.assert_allclose(out['score'].to_numpy(), expected['score'].to_numpy(), rtol=1e-6, atol=1e-5)
        swapped = out['docid'].to_numpy() != expected['docid'].to_numpy()
        assert sorted(zip(out['qid'][swapped], out['docid'][swapped], out['docno'][swapped])) == \
            sorted(zip(expected['qid'][swapped], expected['docid'][swapped], expected['docno'][swapped]))


@pytest.fixture(scope='module')
def uneven(cluster, corpus):
    """Uneven array shards: one of 5 documents (fewer than most k), an empty one, then two large ones."""
    docs, _ = corpus
    bounds = [0, 5, 5, 1600, len(docs)]
    return [docs[a:b] for a, b in zip(bounds, bounds[1:])]


@pytest.fixture(scope='module')
def pruned_shards(uneven, corpus):
    return ShardedPrunedRetriever(shards=uneven, num_results=len(corpus[0]) + 1, strategy='pruned')


def test_split_flex_index(tmp_path):
    docs = np.arange(40, dtype=np.float32).reshape(10, 4)
    index = flex_index(tmp_path / 'docs.flex', docs)
    shards = split_flex_index(index, tmp_path / 'shards', 3)
    assert [s.index_path.name for s in shards] == ['shard-0-of-3.flex', 'shard-1-of-3.flex', 'shard-2-of-3.flex']
    assert [len(s) for s in shards] == [3, 3, 4]
    np.testing.assert_array_equal(np.concatenate([s.payload()[1] for s in shards]), docs)
    assert [d for s in shards for d in s.payload()[0].fwd[np.arange(len(s))]] == [f'd{i}' for i in range(10)]
    with pytest.raises(ValueError, match='shard-0-of-3.flex exists; remove it, or pass another folder'):
        split_flex_index(index, tmp_path / 'shards', 3)
    with pytest.raises(ValueError, match='num_shards=11 is more than the 10 documents'):
        split_flex_index(index, tmp_path / 'more', 11)
    with pytest.raises(ValueError, match='num_shards must be an integer >= 1'):
        split_flex_index(index, tmp_path / 'none', 0)


def test_out_of_core_is_judged_per_node_from_every_shard_on_it():
    # each actor's shard bytes in files (0: an array) against its node's memory; a node's shards add up
    a, b = ('node-a', '10.0.0.1'), ('node-b', '10.0.0.2')
    gib = 2 ** 30
    assert not sharded.nodes_out_of_core([a, b], [6 * gib, 6 * gib], [16 * gib, 16 * gib])
    assert sharded.nodes_out_of_core([a, a], [6 * gib, 6 * gib], [16 * gib, 16 * gib])  # 12 of 16 GiB on one node
    assert sharded.nodes_out_of_core([a, b], [1 * gib, 9 * gib], [64 * gib, 16 * gib])  # the small node
    assert not sharded.nodes_out_of_core([a, a], [0, 0], [gib, gib])  # arrays are in memory


@pytest.mark.parametrize('strategy', ['pruned', 'dense'])
def test_same_as_one_index_for_every_k(request, uneven, corpus, strategy):
    docs, query_vecs = corpus
    retriever = request.getfixturevalue('pruned_shards') if strategy == 'pruned' else \
        ShardedPrunedRetriever(shards=uneven, num_results=len(docs) + 1, strategy='dense')
    queries = query_frame(query_vecs)
    for k in [*range(1, 12), K, 1000, len(docs) - 1, len(docs), len(docs) + 1]:
        single = PrunedRetriever(index=docs, num_results=k, strategy=strategy)
        fused = (retriever % k).compile()  # the first (k = 1) starts the actors that every k then shares
        if k < retriever.num_results:
            assert isinstance(fused, ShardedPrunedRetriever) and fused.num_results == k
            assert fused._actors is retriever._actors
        assert_same_ranking(fused(queries), single(queries), exact=strategy == 'pruned')
    assert len(retriever._actors.handles) == 3  # no actor for the empty shard


def test_ties_across_shards_go_to_the_lower_global_docid(cluster):
    # small integers: every score is exact in float32, and many documents in different shards share one
    rng = np.random.default_rng(3)
    docs = rng.integers(-1, 2, size=(90, 4)).astype(np.float32)
    docnos = [f'doc-{i}' for i in range(len(docs))]
    query_vecs = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [0, 2, -1, 1], [0, 0, 0, 0]], dtype=np.float32)
    retriever = ShardedPrunedRetriever(shards=[docs[:7], docs[7:41], docs[41:]], num_results=30, docnos=docnos,
                                       strategy='pruned', drop_query_vec=True)
    out = retriever(query_frame(query_vecs))
    for i, (_, group) in enumerate(out.groupby('qid', sort=False)):
        scores = docs @ query_vecs[i]
        expected = np.lexsort((np.arange(len(docs)), -scores))[:30]  # by hand: higher score, then lower docid
        assert group['docid'].tolist() == expected.tolist()
        assert group['score'].tolist() == scores[expected].tolist()
        assert len(set(scores[expected])) < 30  # there were ties to break
    assert_same_ranking(out, PrunedRetriever(index=docs, num_results=30, docnos=docnos, strategy='pruned',
                                             drop_query_vec=True)(query_frame(query_vecs)))
    assert 'query_vec' not in out.columns


def test_flex_shards_placed_by_resources_and_refused_once_changed(cluster, corpus, tmp_path):
    docs, query_vecs = corpus
    index = flex_index(tmp_path / 'docs.flex', docs)
    shards = split_flex_index(index, tmp_path / 'shards', 2)
    places = [{'node-b': 1}, {'node-a': 1}]
    retriever = ShardedPrunedRetriever(shards=shards, num_results=K, resources=places)
    assert_same_ranking(retriever(query_frame(query_vecs)), PrunedRetriever(index=index, num_results=K)(
        query_frame(query_vecs)), exact=False)  # 'auto': dense on these small matrices
    ray = cluster
    nodes = {n['NodeID']: n['Resources'] for n in ray.nodes()}
    where = ray.get([h.__ray_call__.remote(lambda server: ray.get_runtime_context().get_node_id())
                     for h in retriever._actors.handles])
    assert [[r for r in nodes[node] if r.startswith('node-')] for node in where] == [['node-b'], ['node-a']]
    # shard 0 rewritten with fewer documents, then its actor restarts: the global docids of shard 1 no longer hold
    flex_index(shards[0].index_path, docs[:1000])
    cluster.kill(retriever._actors.handles[0], no_restart=False)
    with pytest.raises(RuntimeError, match=r'shard 0 \(.*shard-0-of-2.flex\) now holds 1000 documents, 1500 when it '
                                           'started'):
        retriever(query_frame(query_vecs))


def test_killed_actor_recovered_then_reported(cluster, corpus, tmp_path):
    docs, query_vecs = corpus
    retriever = ShardedPrunedRetriever(shards=[docs[:1500], docs[1500:]], num_results=K, max_restarts=1)
    expected = PrunedRetriever(index=docs, num_results=K)(query_frame(query_vecs))
    assert_same_ranking(retriever(query_frame(query_vecs)), expected, exact=False)
    marker = tmp_path / 'die-once'
    marker.touch()

    def die_once(server):
        if os.path.exists(marker):
            os.unlink(marker)
            os._exit(1)

    # queued before the batch on the same actor: the actor dies with the batch's search waiting for it; Ray
    # restarts it (its one restart) and the search is sent again
    retriever._actors.handles[1].__ray_call__.remote(die_once)
    assert_same_ranking(retriever(query_frame(query_vecs)), expected, exact=False)
    assert not marker.exists()
    cluster.kill(retriever._actors.handles[1], no_restart=False)  # no restart left
    with pytest.raises(RuntimeError, match=r'the actor of shard 1 \(an array of 1500 x 48\) died and could not be '
                                           r'recovered \(max_restarts=1\)'):
        retriever(query_frame(query_vecs))


def test_every_shard_takes_the_plan_of_the_whole_collection(cluster, uneven, corpus, monkeypatch):
    docs, query_vecs = corpus
    # a model under which the pruned paths are far cheaper than dense, planned even for these small matrices: each
    # shard alone would be dense (under MIN_PRUNED_BYTES), whose BLAS sums would round scores otherwise
    cheap_pruned = planner.CostModel(dense_gemm_fixed=100, dense_gemm_per_query=100, pruned_fixed=0.1, pruned_slope=0.5,
                                     batch_per_query=0.05, batch_union=2, batch_per_kept=0.2, compressed_fixed=100,
                                     compressed_slope=1, compressed_call_seconds=1, compressed_pass_fixed=100,
                                     compressed_pass_per_query=1, compressed_pass_call_seconds=1, rescore_seconds=1,
                                     gemv_seconds_per_byte=1e-9)
    monkeypatch.setattr(planner, 'MIN_PRUNED_BYTES', docs[:1000].nbytes)  # above every shard, below the collection
    monkeypatch.setattr(calibration, 'model', lambda **_: cheap_pruned)  # the single index's model
    retriever = ShardedPrunedRetriever(shards=uneven, num_results=K)
    retriever._actors.model = cheap_pruned  # the model the first shard's node would give
    single = PrunedRetriever(index=docs, num_results=K)
    for queries in (query_vecs[:1], query_vecs):
        assert retriever.choice(queries).plan == single.plan(queries) != Plan('dense')
        assert_same_ranking(retriever(query_frame(queries)), single(query_frame(queries)), exact=True)
    retriever.close()


def test_auto_on_shards_takes_the_path_the_driver_measured_fastest(cluster, uneven, corpus, monkeypatch):
    docs, query_vecs = corpus
    # the model (per query): compressed cheapest, pruned within the margin, dense far off; the driver's fake clock
    # says pruned is faster, and the sharded call finds it
    estimates = {'dense': 10.0, 'pruned': 1.5, 'compressed': 1.0}
    seconds = {'dense': 1.0, 'pruned': 0.2, 'compressed': 0.5}
    model = SimpleNamespace(path_costs=lambda queries, **_: {p: c * len(queries) for p, c in estimates.items()})
    monkeypatch.setattr(planner, 'MIN_PRUNED_BYTES', 0)  # the small test shards would otherwise go dense
    retriever = ShardedPrunedRetriever(shards=uneven, num_results=K)
    retriever._actors.model = model  # the model the first shard's node would give
    now, paths = [0.0], []
    retriever._measured.clock = lambda: now[0]
    search = retriever._search

    def timed_search(ray, actors, queries, plan):
        paths.append(plan.path)
        now[0] += seconds[plan.path] * len(queries)
        return search(ray, actors, queries, plan)
    monkeypatch.setattr(retriever, '_search', timed_search)
    query = query_frame(query_vecs[2:3])
    expected = {path: PrunedRetriever(index=docs, num_results=K, strategy=path)(query)
                for path in ('pruned', 'compressed')}
    for _ in range(6):
        out = retriever(query)
        assert_same_ranking(out, expected[paths[-1]])  # each path's scores are one index's on that path
    # the model's best first, each path twice (its first run is cold), then the one measured faster
    assert paths == ['compressed', 'compressed', 'pruned', 'pruned', 'pruned', 'pruned']
    assert retriever.choice(query_vecs[2:3]).reason == 'measured'
    assert (retriever % 5).compile()._measured is retriever._measured  # a % k variant shares the driver's timings
    retriever.close()


def test_node_lost_pinned_shard_reported_within_timeout_unpinned_recovered(cluster, local_cluster, corpus):
    docs, query_vecs = corpus
    queries = query_frame(query_vecs)
    expected = PrunedRetriever(index=docs, num_results=K)(queries)
    lost = local_cluster.add_node(**SMALL_NODE, resources={'only-here': 1, 'anywhere': 1})
    pinned = ShardedPrunedRetriever(shards=[docs[:1500], docs[1500:]], num_results=K, timeout=60,
                                    resources=[{'only-here': 0.1}, {'node-a': 0.1}])
    unpinned = ShardedPrunedRetriever(shards=[docs[:1500], docs[1500:]], num_results=K, timeout=30,
                                      resources=[{'anywhere': 0.1}, {'node-b': 0.1}])
    for retriever in (pinned, unpinned):
        assert_same_ranking(retriever(queries), expected, exact=False)
        assert retriever._actors.nodes[0][0] == lost.node_id
    pinned.timeout = 3  # started within 60 s (a loaded machine starts actors slowly); the bound under test is 3 s
    spare = local_cluster.add_node(**SMALL_NODE, resources={'anywhere': 1})
    local_cluster.remove_node(lost)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=(
            rf"the actor of shard 0 \(an array of 1500 x 48\) has had no node for timeout=3 s; it was last on node "
            rf"{lost.node_id[:12]} \(.*\), which is lost, and no live node offers \{{'CPU': 0, 'only-here': 0.1\}}\. "
            r"Start a node that offers them")):
        pinned(queries)
    assert time.monotonic() - started < 3 + 20  # the timeout, the probe's period and a loaded machine's slack
    assert_same_ranking(unpinned(queries), expected, exact=False)  # restarted on the spare node, the batch re-sent
    assert unpinned._actors.nodes[0][0] == spare.node_id
    pinned.close()
    unpinned.close()
    local_cluster.remove_node(spare)


@pytest.mark.parametrize('flex', [False, True])
def test_docnos_shared_by_two_shards_refused(cluster, tmp_path, flex):
    rng = np.random.default_rng(5)
    a, b = rng.normal(size=(4, 8)).astype('f4'), rng.normal(size=(4, 8)).astype('f4')
    if flex:
        shards = [flex_index(tmp_path / 'a.flex', a, list('abcd')), flex_index(tmp_path / 'b.flex', b, list('cdef'))]
        kwargs = {'shards': shards}
        where = rf'shard 0 \({tmp_path}/a.flex\) and in shard 1 \({tmp_path}/b.flex\)'
    else:
        kwargs = {'shards': [a, b], 'docnos': ['a', 'b', 'c', 'd', 'c', 'd', 'e', 'f']}
        where = r'shard 0 \(an array of 4 x 8\) and in shard 1 \(an array of 4 x 8\)'
    retriever = ShardedPrunedRetriever(**kwargs, num_results=8)
    with pytest.raises(ValueError, match=f"docno 'c' is in {where}, so a ranking could hold it twice; put each "
                                         'document in one shard only'):
        retriever(query_frame(a[:1]))
    assert retriever._actors.handles is None  # nothing left running


def test_shared_hashes():
    found = sharded.shared_hashes([np.array([1, 5, 9], dtype=np.uint64), np.array([2, 5, 9, 11], dtype=np.uint64),
                                   np.array([], dtype=np.uint64), np.array([3, 3, 12], dtype=np.uint64)])
    assert found.tolist() == [3, 5, 9]


def test_unreachable_address_fails_within_its_bound(cluster, corpus, monkeypatch):
    with socket.socket() as unused:  # a port nothing listens on once closed
        unused.bind(('127.0.0.1', 0))
        port = unused.getsockname()[1]
    monkeypatch.setattr(cluster, 'is_initialized', lambda: False)  # as a process not connected yet
    started = time.monotonic()
    with pytest.raises(ConnectionError, match=rf"ray_address: no Ray cluster answers at '127.0.0.1:{port}' \(.*"
                                              r"timeout=5 s\): start one there"):
        ShardedPrunedRetriever(shards=[corpus[0]], ray_address=f'127.0.0.1:{port}', timeout=5)(
            query_frame(corpus[1]))
    assert time.monotonic() - started < 5 + 10


def test_the_address_of_a_ray_cluster_passes_the_check(local_cluster):
    """The probe that refuses a service that is not Ray (tests/experiment/test_cells.py) accepts a Ray GCS."""
    sharded.check_ray_address(local_cluster.address, 10, 'ray_address')


def test_close_releases_the_actors_and_their_cpus(cluster, corpus):
    docs, query_vecs = corpus
    queries = query_frame(query_vecs)
    # node-a's one CPU: a second retriever's actor cannot have it while the first's lives
    with ShardedPrunedRetriever(shards=[docs], num_results=K, num_cpus=1, resources=[{'node-a': 0.1}],
                                timeout=30) as first:
        expected = first(queries)
        handles = first._actors.handles

        def numba_threads(server):
            import numba
            return numba.get_num_threads()
        # the one CPU reserved is the one thread it scored with (numba's setting is per thread: the search's)
        assert cluster.get(handles[0].__ray_call__.remote(numba_threads)) == 1
        with pytest.raises(RuntimeError, match=r"shard 0 .* found no node with \{'CPU': 1, 'node-a': 0.1\} free"):
            ShardedPrunedRetriever(shards=[docs], num_results=K, num_cpus=1, resources=[{'node-a': 0.1}],
                                   timeout=2)(queries)
    assert first._actors.handles is None
    with pytest.raises(cluster.exceptions.RayActorError):
        cluster.get(handles[0].where.remote(), timeout=30)
    second = ShardedPrunedRetriever(shards=[docs], num_results=K, num_cpus=1, resources=[{'node-a': 0.1}], timeout=30)
    pd.testing.assert_frame_equal(second(queries), expected)
    second.close()
    pd.testing.assert_frame_equal(second(queries), expected)  # a call after close() starts new actors
    second.close()


class KilledActor:
    """A fake actor handle that, as a real one may (``ray.kill`` is asynchronous), still answers ``answers`` calls
    after it was killed, then fails as a dead actor does."""
    class Gone(Exception):
        pass

    def __init__(self, answers: float):
        self.answers, self.killed, self.asked = answers, False, 0
        self.where = SimpleNamespace(options=lambda **_: SimpleNamespace(remote=self._ask))

    def _ask(self):
        self.asked += 1
        alive = not self.killed or self.answers > 0
        self.answers -= self.killed

        def reply():
            if not alive:
                raise KilledActor.Gone('the actor is dead')
            return 'node', '127.0.0.1'
        return reply


@pytest.fixture
def fake_ray(monkeypatch):
    """Ray as ``close()`` sees it, for :class:`KilledActor` handles."""
    ray = SimpleNamespace(kill=lambda handle, no_restart: setattr(handle, 'killed', no_restart),
                          wait=lambda refs, num_returns, timeout: (refs, []), get=lambda ref: ref(),
                          exceptions=SimpleNamespace(RayActorError=KilledActor.Gone))
    monkeypatch.setitem(sys.modules, 'ray', ray)


def test_close_returns_once_each_killed_actor_is_gone(fake_ray, corpus, caplog):
    retriever = ShardedPrunedRetriever(shards=[corpus[0][:10], corpus[0][10:]], timeout=30)
    handles = retriever._actors.handles = [KilledActor(answers=0), KilledActor(answers=3)]
    retriever.close()
    assert [h.asked for h in handles] == [1, 4]  # the second answered 3 times after the kill, then was gone
    assert retriever._actors.handles is None and 'still answered' not in caplog.text
    # one that never goes: close() returns after its timeout, and says so
    retriever.timeout = 0.3
    retriever._actors.handles = [KilledActor(answers=float('inf'))]
    started = time.monotonic()
    with caplog.at_level(logging.WARNING):
        retriever.close()
    assert time.monotonic() - started < 0.3 + 5
    assert 'ShardedPrunedRetriever: 1 actor(s) still answered timeout=0.3 s after close() killed them' in caplog.text


def test_pickle_repr_equality_and_empty_input(cluster, corpus, tmp_path):
    docs, query_vecs = corpus
    retriever = ShardedPrunedRetriever(shards=[docs[:10], docs[10:]], num_results=5, strategy='dense')
    assert repr(retriever) == ('ShardedPrunedRetriever(shards=[<ndarray 10x48 float32>, <ndarray 2990x48 float32>], '
                               "num_results=5, strategy='dense')")
    empty = retriever(query_frame(query_vecs).iloc[:0])
    assert list(empty.columns) == ['qid', 'query', 'query_vec', 'docno', 'docid', 'score', 'rank'] and not len(empty)
    assert retriever._actors.handles is None  # nothing started for an empty input
    expected = retriever(query_frame(query_vecs))
    clone = pickle.loads(pickle.dumps(retriever))
    assert clone._actors.handles is None  # a copy starts its own actors
    pd.testing.assert_frame_equal(clone(query_frame(query_vecs)), expected)
    # FlexIndex shards compare by path (arrays, as in PrunedRetriever, by identity)
    shards = [flex_index(tmp_path / 'a.flex', docs[:10]), flex_index(tmp_path / 'b.flex', docs[10:20])]
    on_disk = ShardedPrunedRetriever(shards=shards, resources=[{'node-a': 1}, {'node-b': 1}])
    clone = pickle.loads(pickle.dumps(on_disk))
    assert clone == on_disk and hash(clone) == hash(on_disk)
    assert on_disk != ShardedPrunedRetriever(shards=shards[::-1], resources=[{'node-a': 1}, {'node-b': 1}])
    assert on_disk != ShardedPrunedRetriever(shards=shards)
    assert repr(on_disk).startswith(f"ShardedPrunedRetriever(shards=[FlexIndex('{tmp_path}")


@pytest.mark.parametrize('kwargs, message', [
    ({'shards': []}, 'shards must be a non-empty list'),
    ({'shards': np.zeros((3, 4))}, 'shards must be a non-empty list'),
    ({'shards': [np.zeros((0, 4))]}, 'every shard is empty'),
    ({'shards': [np.ones((3, 4)), np.ones((3, 5))]}, 'of one dimensionality'),
    ({'shards': [np.ones((3, 4))], 'docnos': ['a']}, 'docnos has 1 entries but the shards hold 3 rows'),
    ({'shards': [np.ones((3, 4))], 'num_results': 0}, 'shard 0: PrunedRetriever: num_results must be an integer'),
    ({'shards': [np.ones((3, 4))], 'strategy': 'fast'}, "shard 0: PrunedRetriever: unknown strategy 'fast'"),
    ({'shards': [np.ones((3, 4)), 'docs.flex']}, 'shard 1: PrunedRetriever: index must be a pyterrier_dr.FlexIndex'),
    ({'shards': [np.ones((3, 4)), SimpleNamespace(index_path='docs.flex')]}, 'all FlexIndexes or all arrays, not'),
    ({'shards': [np.ones((3, 4))], 'drop_query_vec': 1}, 'drop_query_vec must be True or False'),
    ({'shards': [np.ones((3, 4))], 'num_cpus': 0}, 'num_cpus must be a positive number'),
    ({'shards': [np.ones((3, 4))], 'max_restarts': -1}, 'max_restarts must be an integer >= 0'),
    ({'shards': [np.ones((3, 4))], 'timeout': 0}, 'timeout must be a positive number'),
    ({'shards': [np.ones((3, 4))], 'start_timeout': -1}, 'start_timeout must be a positive number'),
    ({'shards': [np.ones((3, 4))], 'resources': [{'a': 1}, {'b': 1}]}, 'one dict of Ray resources per shard'),
    ({'shards': [np.ones((3, 4))], 'ray_address': 6379}, "ray_address must be None, 'auto' or 'host:port'"),
])
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ShardedPrunedRetriever(**kwargs)


def test_bad_queries_and_shards(cluster, corpus, pruned_shards, tmp_path):
    docs, query_vecs = corpus
    retriever = pruned_shards
    frame = query_frame(query_vecs)
    frame.at[2, 'query_vec'] = query_vecs[2][:-1]
    with pytest.raises(ValueError, match=f"ShardedPrunedRetriever: query_vec of qid='q2' has shape \\({DIMS - 1},\\)"):
        retriever(frame)
    frame.at[2, 'query_vec'] = np.full(DIMS, 1e38, dtype=np.float32)
    with pytest.raises(ValueError, match="qid='q2' .* can score beyond float32"):
        retriever(frame)
    with pytest.raises(ValueError, match=r"ShardedPrunedRetriever: shard 0 \(.*wide.flex\) holds 48-dimensional "
                                         r"vectors but shard 1 \(.*narrow.flex\) holds 8; every shard needs"):
        ShardedPrunedRetriever(shards=[flex_index(tmp_path / 'wide.flex', docs[:100]),
                                       flex_index(tmp_path / 'narrow.flex', docs[:50, :8])])(query_frame(query_vecs))
    broken = docs[:200].copy()
    broken[105, 3] = np.nan
    with pytest.raises(ValueError, match=r"shard 1 \(an array of 100 x 48\) failed to open: PrunedRetriever: "
                                         r"document '105' .* has NaN or infinite values"):
        ShardedPrunedRetriever(shards=[broken[:100], broken[100:]])(query_frame(query_vecs))
    with pytest.raises(RuntimeError, match=r"shard 0 .* found no node with \{'CPU': 0, 'node-c': 1\} free in "
                                           r"timeout=1 s"):
        ShardedPrunedRetriever(shards=[docs], resources=[{'node-c': 1}], timeout=1)(query_frame(query_vecs))


def slow_server(delay: float) -> type:
    """A ShardServer whose actor takes ``delay`` seconds more to start, as on a loaded machine; a class made here is
    sent to the workers by value (the driver's monkeypatch of the module would not reach them)."""
    class SlowServer(sharded.ShardServer):
        def __init__(self, *args):
            time.sleep(delay)
            super().__init__(*args)
    return SlowServer


def test_actors_slow_to_start_are_waited_for_past_the_timeout_with_a_warning(cluster, corpus, monkeypatch, caplog):
    docs, query_vecs = corpus
    queries = query_frame(query_vecs)
    monkeypatch.setattr(sharded, 'ShardServer', slow_server(5))  # 5 s at least, whatever the machine's speed
    with caplog.at_level(logging.WARNING, logger=sharded.__name__), \
            ShardedPrunedRetriever(shards=[docs[:1500], docs[1500:]], num_results=K, timeout=1) as retriever:
        out = retriever(queries)
    assert_same_ranking(out, PrunedRetriever(index=docs, num_results=K)(queries), exact=False)
    assert 'the actors of shards [0, 1] have a node but have not started after timeout=1 s' in caplog.text


def test_the_shard_whose_resources_no_node_offers_is_the_one_named(cluster, corpus, monkeypatch):
    docs, query_vecs = corpus
    monkeypatch.setattr(sharded, 'ShardServer', slow_server(30))  # shard 0 still starting when the timeout passes
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=(
            rf"the actor of shard 1 \(an array of {len(docs) - 1500} x {DIMS}\) found no node with \{{'CPU': 0, "
            r"'node-c': 1\} free in timeout=1 s \(no live node offers them; ")):
        ShardedPrunedRetriever(shards=[docs[:1500], docs[1500:]], resources=[{}, {'node-c': 1}], timeout=1)(
            query_frame(query_vecs))
    assert time.monotonic() - started < 1 + 30  # the timeout, the polls and a loaded machine's slack


def test_an_actor_that_does_not_start_within_start_timeout_is_reported(cluster, corpus, monkeypatch):
    docs, query_vecs = corpus
    monkeypatch.setattr(sharded, 'ShardServer', slow_server(120))
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"the actors of shards \[0\] had a node but did not start in "
                                           r"start_timeout=2 s \(Ray starts a worker process"):
        ShardedPrunedRetriever(shards=[docs], timeout=1, start_timeout=2)(query_frame(query_vecs))
    assert time.monotonic() - started < 2 + 30
