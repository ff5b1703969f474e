"""The measured choice of strategy='auto' (pruned.planner, with its timings): buckets and candidates by hand,
the retriever driven by a fake clock, so that which path is faster is the test's to say: a path faster than the model
says is found and taken, a clock agreeing with the model never runs a path beyond the margin, the record is kept
for later processes and starts over when the index is rewritten. No timed assertions."""
import numpy as np
import pytest
from pruned_data import flex_index, full_topk, make_corpus

from pyterrier_rdime import PrunedRetriever, store
from pyterrier_rdime.pruned import calibration, kept, planner
from pyterrier_rdime.pruned.planner import Choice

COMPILED = pytest.mark.skipif(not kept.NUMBA_AVAILABLE,
                              reason='auto scores densely without numba: pip install pyterrier-rdime[fast]')


class Estimates:
    """A cost model that estimates each path at a fixed cost per query."""

    def __init__(self, **costs):
        self.costs = {path.replace('_', ' '): value for path, value in costs.items()}

    def path_costs(self, query_vecs, *, k, matrix_bytes, one_pass):
        return {path: value * len(query_vecs) for path, value in self.costs.items()
                if one_pass or 'one pass' not in path}


class FakeClock:
    """Each scored call advances the clock by the seconds per query its path takes (the test's ``speeds``)."""

    def __init__(self, speeds):
        self.speeds, self.now, self.paths, self.sizes = speeds, 0.0, [], []

    def __call__(self):
        return self.now


@pytest.fixture
def driven(tmp_path, monkeypatch):
    """``drive(retriever, speeds)``: the retriever's calls timed by a fake clock; returns the clock, whose ``paths``
    lists the path each call was scored on."""
    monkeypatch.setenv('PYTERRIER_RDIME_CACHE', str(tmp_path / 'cache'))
    monkeypatch.setattr(planner, 'MIN_PRUNED_BYTES', 0)  # the small test matrix would otherwise go dense

    def drive(retriever, speeds, estimates):
        monkeypatch.setattr(calibration, 'model', lambda **kwargs: estimates)
        clock = FakeClock(speeds)
        retriever._measured.clock = clock
        scorer = retriever._scorer

        def timed_scorer(plan, query_vecs):
            score = scorer(plan, query_vecs)

            def run():
                clock.paths.append(plan.path)
                clock.sizes.append(len(query_vecs))
                clock.now += speeds[plan.path] * len(query_vecs)
                return score()
            return run
        monkeypatch.setattr(retriever, '_scorer', timed_scorer)
        return clock
    return drive


def test_buckets_and_candidates_by_hand():
    half = np.zeros((5, 20), dtype=np.float32)
    half[:, :7] = 1  # 35 % kept, 5 queries: a batch of 4 to 7
    assert planner.bucket(half, 100) == 'k100 n4 kept0.25-0.50'
    assert planner.bucket(half[:1, :4], 10) == 'k10 n1 kept0.75-1.00'
    assert planner.bucket(np.ones((64, 20)), 1000) == 'k1000 n64 kept0.75-1.00'
    assert planner.bucket(np.eye(20)[:1], 1000) == 'k1000 n1 kept0.00-0.25'
    # within twice the least, cheapest first; a tie in the order given
    assert planner.candidates({'dense': 2.0, 'pruned': 1.0, 'compressed': 2.5}) == ['pruned', 'dense']
    assert planner.candidates({'dense': 1.0, 'pruned': 1.0}) == ['dense', 'pruned']
    assert planner.candidates({'dense': 9.0, 'compressed': 1.0}) == ['compressed']


def test_exploring_order_the_cold_run_the_recent_timings_and_the_recheck():
    seconds = {'a': 1.2, 'b': 0.8}  # per call; the model says a 1.0, b 1.5: 1.2 and 0.533 s per unit
    now = [0.0]
    choice_of = planner.MeasuredChoice(None, clock=lambda: now[0])
    costs = {'a': 1.0, 'b': 1.5, 'c': 5.0}  # c is beyond the margin

    def run(choice):
        choice_of.timed(choice, lambda: now.__setitem__(0, now[0] + seconds[choice.path]))

    taken = []
    for _ in range(2 * planner.RECHECK_EVERY + 10):
        choice = planner.measured_choice(costs, 'bucket', choice_of)
        taken.append((choice.path, choice.reason))
        run(choice)
    # a (the model's best) first, twice: its first run in the process is cold; then b, twice
    assert taken[:4] == [('a', 'explore'), ('a', 'explore'), ('b', 'explore'), ('b', 'explore')]
    assert {path for path, reason in taken[4:] if reason == 'measured'} == {'b'}
    assert [i for i, (path, reason) in enumerate(taken) if reason == 'recheck'] == [
        4 + planner.RECHECK_EVERY, 4 + 2 * planner.RECHECK_EVERY]  # the re-check counts as a call
    assert all(path == 'a' for path, reason in taken if reason == 'recheck')
    assert choice_of.bucket_timings('bucket')[0] == pytest.approx({'a': 1.2, 'b': 0.8 / 1.5})
    # another call of the bucket that the model prices otherwise: the factors correct the estimates (a: 0.5 x 1.2 = 0.6
    # beats b: 1.5 x 0.533 = 0.8)
    assert planner.measured_choice({'a': 0.5, 'b': 1.5}, 'bucket', choice_of).path == 'a'
    # the least of the recent timings: one slow timing does not move the record, RECENT slow ones do
    seconds['b'] = 3.0
    for _ in range(planner.RECENT - 1):
        run(Choice('b', 1.5, 'bucket', 'measured'))
    assert choice_of.bucket_timings('bucket')[0]['b'] == pytest.approx(0.8 / 1.5)
    run(Choice('b', 1.5, 'bucket', 'measured'))
    assert choice_of.bucket_timings('bucket')[0]['b'] == pytest.approx(2.0)
    assert planner.measured_choice(costs, 'bucket', choice_of).path == 'a'
    # one candidate: taken, nothing timed
    assert planner.measured_choice({'a': 1.0, 'c': 5.0}, 'other', choice_of) == Choice('a', 1.0, 'other', 'only')


def test_a_long_first_call_is_timed_once():
    # a first call of COLD_SECONDS or more is kept: the slow path is not run again to learn it is slow
    now = [0.0]
    choice_of = planner.MeasuredChoice(None, clock=lambda: now[0])
    seconds = {'a': planner.COLD_SECONDS * 3, 'b': planner.COLD_SECONDS / 2}
    taken = []
    for _ in range(5):
        choice = planner.measured_choice({'a': 1.0, 'b': 1.5}, 'bucket', choice_of)
        taken.append((choice.path, choice.reason))
        choice_of.timed(choice, lambda: now.__setitem__(0, now[0] + seconds[choice.path]))
    assert taken == [('a', 'explore'), ('b', 'explore'), ('b', 'explore'), ('b', 'measured'), ('b', 'measured')]


@COMPILED
def test_a_first_call_is_timed_without_numba_compiling_its_kernel():
    # a first run compiles a path's kernels in its first call: that one-off cost is not the path's time. Path a's first
    # call compiles a kernel for 5 s (on the fake clock) and scores for just under COLD_SECONDS: less the compiling it
    # is a short cold call, so a is explored again (kept as timed, the slow-looking a would never be taken again)
    import numba
    from numba.core import event

    @numba.njit
    def kernel(x):
        return x + 1

    now = [0.0]

    class FiveSecondCompiles(event.Listener):
        depth = 0

        def on_start(self, _):
            self.depth += 1

        def on_end(self, _):
            self.depth -= 1
            now[0] += 5.0 * (self.depth == 0)

    def call_a():
        kernel(1)  # compiled in the first call only
        now[0] += planner.COLD_SECONDS - 1

    choice_of = planner.MeasuredChoice(None, clock=lambda: now[0])
    taken = []
    # installed before the planner's listener, which so reads the clock after the compile's 5 s
    with event.install_listener('numba:compile', FiveSecondCompiles()):
        for _ in range(3):
            choice = planner.measured_choice({'a': 1.0, 'b': 1.5}, 'bucket', choice_of)
            taken.append((choice.path, choice.reason))
            choice_of.timed(choice, call_a if choice.path == 'a' else lambda: now.__setitem__(0, now[0] + 1.0))
    assert now[0] == 5.0 + 2 * (planner.COLD_SECONDS - 1) + 1.0  # one compile
    assert taken == [('a', 'explore'), ('a', 'explore'), ('b', 'explore')]
    assert choice_of.bucket_timings('bucket')[0] == {'a': planner.COLD_SECONDS - 1}


@COMPILED
def test_auto_switches_to_a_path_faster_than_the_model_says(driven):
    docs, query_vecs = make_corpus()
    retriever = PrunedRetriever(index=docs, num_results=10, verbose=False)
    # the model: compressed cheapest, pruned within the margin, dense far off; the clock: pruned is faster
    clock = driven(retriever, {'dense': 1.0, 'pruned': 0.2, 'compressed': 0.5},
                   Estimates(dense=10.0, pruned=1.5, compressed=1.0))
    query = query_vecs[2:3]
    for _ in range(8):
        scores, docids = retriever.search(query)
        ref_scores, ref_ids = full_topk(docs, query[0], 10)
        assert docids[0].tolist() == ref_ids.tolist()
        np.testing.assert_allclose(scores[0], ref_scores, rtol=1e-5)
    assert clock.paths == ['compressed', 'compressed', 'pruned', 'pruned'] + ['pruned'] * 4
    assert retriever.plan(query).path == 'pruned' and retriever.plan(query).strategy == 'pruned'
    # a % k variant shares the timings: its k is another bucket, explored on its own
    assert (retriever % 5).compile()._measured is retriever._measured


@COMPILED
def test_a_larger_call_explores_a_per_query_path_on_its_first_share(driven):
    docs, query_vecs = make_corpus()
    batch = np.concatenate([query_vecs] * 11)[:64]  # 64 rows (a share of 8), every kind of query in it
    retriever = PrunedRetriever(index=docs, num_results=10, verbose=False)
    # the model: compressed cheapest, its one pass within the margin; the clock: the one pass is 10x faster
    speeds = {'compressed': 1.0, 'compressed one pass': 0.1}
    clock = driven(retriever, speeds, Estimates(dense=10.0, pruned=10.0, one_pass=10.0, compressed=1.0,
                                                compressed_one_pass=1.5))
    scores, docids = retriever.search(batch)
    for q, query in enumerate(batch):  # every row scored once, in order, as the dense reference ranks it
        ref_scores, ref_ids = full_topk(docs, query, 10)
        assert docids[q].tolist() == ref_ids.tolist()
        np.testing.assert_allclose(scores[q], ref_scores, rtol=1e-5, atol=1e-5)
    for _ in range(4):
        retriever.search(batch)
    assert list(zip(clock.paths, clock.sizes)) == [
        ('compressed', 8), ('compressed', 56),  # explored on 8 rows (cold: not counted), the rest never explores
        ('compressed', 8), ('compressed', 56),  # explored again, counted: 1 s per unit of the share's estimate
        ('compressed one pass', 64), ('compressed one pass', 64),  # explored on the whole call (no share): cold, then
        ('compressed one pass', 64)]  # timed; then taken, measured
    assert retriever._measured.bucket_timings(planner.bucket(batch, 10))[0] == pytest.approx(
        {'compressed': 1.0, 'compressed one pass': 0.1 / 1.5})
    # the share: an eighth of the call, at least 8 rows; a call of 8 or fewer is explored whole
    estimates, untimed = Estimates(compressed=1.0, compressed_one_pass=1.5), planner.MeasuredChoice(None)
    rows = np.concatenate([batch] * 4)
    shares = [planner.choose(rows[:n], strategy='auto', matrix_bytes=2 ** 30, compiled=True, model=lambda: estimates,
                             k=10, timings=untimed).queries for n in (8, 9, 64, 200)]
    assert shares == [None, 8, 8, 25]


@COMPILED
def test_a_clock_agreeing_with_the_model_never_runs_a_path_beyond_the_margin(driven):
    docs, query_vecs = make_corpus()
    retriever = PrunedRetriever(index=docs, num_results=10, verbose=False)
    speeds = {'dense': 10.0, 'pruned': 1.5, 'one pass': 2.5, 'compressed': 1.0, 'compressed one pass': 1.8}
    clock = driven(retriever, speeds, Estimates(**{path.replace(' ', '_'): value for path, value in speeds.items()}))
    for _ in range(20):
        retriever.search(query_vecs[2:3])  # one query: compressed, pruned
        retriever.search(query_vecs[2:6])  # a batch of 4: compressed, pruned, compressed one pass
    assert 'dense' not in clock.paths and 'one pass' not in clock.paths
    assert set(clock.paths) == {'compressed', 'pruned', 'compressed one pass'}
    assert clock.paths[-10:] == ['compressed'] * 10


@COMPILED
def test_the_record_is_kept_for_later_processes_and_starts_over_with_a_rewritten_index(driven, tmp_path):
    docs, query_vecs = make_corpus()
    index = flex_index(tmp_path / 'docs.flex', docs)
    # no float32 layout on disk: auto leaves the float32 pruned paths out, and times compressed against dense
    speeds, estimates = {'dense': 1.0, 'compressed': 0.5}, Estimates(dense=1.5, pruned=0.1, compressed=1.0)
    query = query_vecs[2:3]
    bucket = planner.bucket(query, 10)
    first = PrunedRetriever(index=index, num_results=10, verbose=False)
    clock = driven(first, speeds, estimates)
    for _ in range(5):
        first.search(query)
    assert clock.paths == ['compressed', 'compressed', 'dense', 'dense', 'compressed']
    # a later process (a new retriever): the record is read and decides without exploring
    later = PrunedRetriever(index=index, num_results=10, verbose=False)
    later_clock = driven(later, speeds, estimates)
    assert later._measured.bucket_timings(bucket)[0] == pytest.approx({'compressed': 0.5, 'dense': 1.0 / 1.5})
    later.search(query)
    assert later_clock.paths == ['compressed']
    # the index rewritten: a new record, explored again
    rewritten = flex_index(tmp_path / 'docs.flex', docs[::-1].copy())
    again = PrunedRetriever(index=rewritten, num_results=10, verbose=False)
    again_clock = driven(again, speeds, estimates)
    assert again._measured.bucket_timings(bucket)[0] == {}
    again.search(query)
    assert again_clock.paths == ['compressed']
    assert planner.measured_choice({'dense': 1.5, 'compressed': 1.0}, bucket, again._measured).reason == 'explore'


@COMPILED
def test_an_index_beyond_the_memory_takes_the_int8_copy_without_exploring(driven, monkeypatch, tmp_path):
    docs, query_vecs = make_corpus()
    retriever = PrunedRetriever(index=flex_index(tmp_path / 'index.flex', docs), num_results=10, verbose=False)
    # in memory the model finds every path equal: dense, the first, is explored (the clock makes it the fastest)
    speeds = {'dense': 0.1, 'pruned': 1.0, 'one pass': 1.0, 'compressed': 1.0, 'compressed one pass': 1.0}
    clock = driven(retriever, speeds, Estimates(**{path.replace(' ', '_'): 1.0 for path in speeds}))
    retriever.search(query_vecs[2:6])
    assert clock.paths == ['dense']
    # vecs.f4 beyond the memory (here: any file), the copy's one pass for a batch and its path for a query, untimed
    monkeypatch.setattr(store, 'OUT_OF_CORE_SHARE', 0)
    for _ in range(3):
        for batch in (query_vecs[2:6], query_vecs[2:3]):
            scores, docids = retriever.search(batch)
            for q, query in enumerate(batch):
                ref_scores, ref_ids = full_topk(docs, query, 10)
                assert docids[q].tolist() == ref_ids.tolist()
                np.testing.assert_allclose(scores[q], ref_scores, rtol=1e-5, atol=1e-5)
    assert clock.paths[1:] == ['compressed one pass', 'compressed'] * 3
    assert retriever.choice(query_vecs[2:6]).reason == 'out of core'
    # nothing timed: dense's one call was cold (not counted), the copy's calls are not measurements
    assert retriever._measured.bucket_timings(planner.bucket(query_vecs[2:6], 10)) == ({}, 0)
    # an array index is in memory whatever its size; a forced strategy takes its own path
    in_memory = PrunedRetriever(index=docs, num_results=10, verbose=False)
    assert in_memory.choice(query_vecs[2:6]).reason != 'out of core'
    assert PrunedRetriever(index=retriever.index, num_results=10, strategy='dense').choice(
        query_vecs[2:6]).path == 'dense'
