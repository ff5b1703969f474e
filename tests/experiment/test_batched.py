"""Systems that share their queries searched together: the same frames as one retriever call per system (numpy and
pruned retrievers), in fewer calls, and a retrieve-mode cell whose frames equal those of one call per system."""
import numpy as np
import pandas as pd
import pyterrier as pt
import pyterrier_dr
import pytest
from test_experiment import _mini_collection

from pyterrier_rdime import SameBudget, TopK
from pyterrier_rdime.experiment import runner, systems
from pyterrier_rdime.experiment.systems import search_together
from pyterrier_rdime.pruned import PrunedRetriever

DIMS = 16


class CountingRetriever(pt.Transformer):
    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def transform(self, inp):
        self.calls.append(len(inp))
        return self.inner(inp)


@pytest.fixture(scope='module')
def docs():
    rng = np.random.default_rng(7)
    vectors = rng.normal(size=(300, DIMS)).astype(np.float32)
    vectors[5] = vectors[6]  # a tie: the lower docid first on every path
    return vectors


@pytest.fixture(scope='module')
def flex(docs, tmp_path_factory):
    index = pyterrier_dr.FlexIndex(str(tmp_path_factory.mktemp('flex') / 'docs.flex'), verbose=False)
    index.index([{'docno': f'd{i}', 'doc_vec': v} for i, v in enumerate(docs)])
    return index


def _systems(docs):
    """Query frames of four systems on the same five queries: the full vectors, two Top-k and a random control."""
    rng = np.random.default_rng(1)
    queries = pd.DataFrame({'qid': [f'q{i}' for i in range(5)], 'query': [f'text {i}' for i in range(5)],
                            'query_vec': list(rng.normal(size=(5, DIMS)).astype(np.float32)),
                            'query_dime': list(rng.normal(size=(5, DIMS)))})
    queries.loc[4, 'query_vec'] = docs[5] * 1  # scores the tied documents highest
    stages = {'full': None, 'k=0.25': TopK(fraction=0.25), 'k=0.5': TopK(fraction=0.5),
              'random': TopK(fraction=0.5) >> SameBudget(control='random', seed=3)}
    return {name: (lambda stage=stage: queries if stage is None else stage(queries)) for name, stage in stages.items()}


@pytest.mark.parametrize('backend', ['numpy', 'pruned-array', 'pruned-flex'])
@pytest.mark.parametrize('batch_queries', [10, 1000])
def test_searched_together_equals_one_call_per_system(backend, batch_queries, docs, flex):
    retriever = {'numpy': lambda: flex.np_retriever(num_results=7),
                 'pruned-array': lambda: PrunedRetriever(index=docs, num_results=7),
                 'pruned-flex': lambda: PrunedRetriever(index=flex, num_results=7)}[backend]()
    queries = _systems(docs)
    alone = {name: retriever(build()) for name, build in queries.items()}
    counting = CountingRetriever(retriever)
    together = list(search_together(counting, queries, batch_queries=batch_queries))
    assert [name for name, _ in together] == list(queries)
    for name, frame in together:
        # these tiny matrices take the BLAS (dense) path, whose float32 sums may depend on how many queries share the
        # product (OpenBLAS on AMD Zen 4): the same documents and ranks, scores to float32 rounding
        pd.testing.assert_frame_equal(frame.drop(columns='score'), alone[name].drop(columns='score'),
                                      check_exact=True, obj=name)
        np.testing.assert_allclose(frame['score'], alone[name]['score'], rtol=1e-6, err_msg=name)
    # 4 systems of 5 queries: every system's rows of 2 queries per call under a limit of 10 rows, all in one call
    # under 1000
    assert counting.calls == ([8, 8, 4] if batch_queries == 10 else [20])


def test_on_a_blas_path_systems_of_two_queries_agree_to_float32_rounding():
    """A matrix-vector product (a call of under 4 queries on the dense path) and a matrix product may sum in other
    orders: a tiny system searched together gets its own call's ranking, its scores to float32 rounding (~1e-6
    relative), as with --workers."""
    rng = np.random.default_rng(0)
    retriever = PrunedRetriever(index=rng.normal(size=(3000, 384)).astype(np.float32), num_results=50,
                                strategy='dense')
    queries = pd.DataFrame({'qid': ['a', 'b'], 'query_vec': list(rng.normal(size=(2, 384)).astype(np.float32)),
                            'query_dime': list(rng.normal(size=(2, 384)))})
    systems = {fraction: (lambda fraction=fraction: TopK(fraction=fraction)(queries)) for fraction in (0.1, 0.5, 1.0)}
    for fraction, frame in search_together(retriever, systems):
        pd.testing.assert_frame_equal(frame, retriever(systems[fraction]()), rtol=1e-5, obj=f'k={fraction}')


def test_a_call_holds_whole_queries_and_a_query_larger_than_the_limit_goes_alone(docs):
    queries = _systems(docs)
    full = np.stack(queries['full']()['query_vec'])
    seen = []

    class Seeing(pt.Transformer):  # notes the queries of each call: those whose full vector each row's values are
        def transform(self, inp):
            seen.append([sorted(i for i in range(len(full)) if np.array_equal(v[v != 0], full[i][v != 0]))
                         for v in inp['query_vec']])
            return PrunedRetriever(index=docs, num_results=3)(inp)
    assert [key for key, _ in search_together(Seeing(), queries, batch_queries=3)] == list(queries)
    assert seen == [[[i]] * 4 for i in range(5)]  # 4 rows per query, over the limit: one call per query
    seen.clear()
    list(search_together(Seeing(), queries, batch_queries=12))
    assert seen == [[[0]] * 4 + [[1]] * 4 + [[2]] * 4, [[3]] * 4 + [[4]] * 4]  # 12 rows, then 8


def test_recorded_calls_are_read_back_by_a_later_run(docs, tmp_path):
    queries = _systems(docs)
    first = CountingRetriever(PrunedRetriever(index=docs, num_results=3))
    records = systems.SystemRecords(tmp_path, 'cell')
    done = dict(search_together(first, queries, batch_queries=10, records=records))
    assert first.calls == [8, 8, 4]
    later = CountingRetriever(PrunedRetriever(index=docs, num_results=3))
    again = dict(search_together(later, queries, batch_queries=10, records=systems.SystemRecords(tmp_path, 'cell')))
    assert later.calls == [0]  # every call read back: only an empty call, for the retriever's columns
    for key, frame in done.items():
        pd.testing.assert_frame_equal(again[key], frame, check_exact=True, obj=key)


def test_a_retrieve_cell_has_the_frames_of_one_call_per_system(tmp_path, monkeypatch):
    """On the compressed path, the one a collection-scale index takes, bit for bit."""
    mini = _mini_collection(tmp_path)
    grids, calls = [], []
    build = runner.build_systems
    monkeypatch.setattr(runner, 'build_systems', lambda *a: grids.append(build(*a)) or grids[-1])

    def compressed(index, backend, num_results, **sharding):
        counting = CountingRetriever(PrunedRetriever(index=index, num_results=num_results, strategy='compressed'))
        calls.append(counting.calls)
        return counting
    monkeypatch.setattr(runner, 'retriever', compressed)
    settings = dict(mode='retrieve', dimes=['prf'], ks=[0.5], num_results=5, control_seeds=2, retriever='pruned',
                    cache_dir=tmp_path / 'cache', verbose=False)
    together = runner.run_experiment(str(mini), **settings)
    monkeypatch.setattr(systems, 'search_together', lambda retriever, queries, run, limit, records: (
        (key, run(retriever, build())) for key, build in queries.items()))  # one call per system
    alone = runner.run_experiment(str(mini), **settings)
    batched, single = grids
    for kind in ('frames', 'seeded', 'sweep'):
        assert list(getattr(batched, kind)) == list(getattr(single, kind))
        for name, frame in getattr(batched, kind).items():
            pd.testing.assert_frame_equal(frame, getattr(single, kind)[name], check_exact=True, obj=f'{kind} {name}')
    for name in ('table', 'perquery', 'kept', 'significance', 'sweep', 'seeds'):
        pd.testing.assert_frame_equal(getattr(together, name), getattr(alone, name), obj=name)
    systems_searched = len(single.frames) + len(single.seeded) + len(single.sweep)
    assert len(calls[1]) == systems_searched  # one call per system without batching
    # with it: Baseline alone, then every other system's 2 queries (the judged ones) in one call of under 512 rows
    assert calls[0] == [2, (systems_searched - 1) * 2] and sum(calls[1]) == sum(calls[0])
