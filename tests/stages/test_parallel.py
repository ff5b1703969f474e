"""Every stage of the package pickles and gives the serial results under PyTerrier's ``.parallel(2)`` with the joblib
backend (worker processes) and the Ray backend (a local Ray instance started once for this module, no network):
the DIME estimators, the thresholds, the scorer, the answers stage and PrunedRetriever on a tiny FlexIndex, whose
workers reopen the index's one on-disk layout instead of rebuilding it."""
import os
import pickle

import numpy as np
import pandas as pd
import pytest

from pyterrier_rdime import (
    EclipseDime,
    KernelDime,
    LlmAnswers,
    LlmDime,
    MagnitudeDime,
    OracleDime,
    PrfDime,
    PrunedRetriever,
    Rdime,
    SwcDime,
    TopK,
    VectorScorer,
    store,
)

QUERIES, CANDIDATES, DIMS = 4, 8, 8
QIDS = [f'q{i}' for i in range(QUERIES)]
rng = np.random.default_rng(11)
QUERY_VECS = rng.standard_normal((QUERIES, DIMS)).astype(np.float32)
DOC_VECS = rng.standard_normal((QUERIES * CANDIDATES, DIMS)).astype(np.float32)
QRELS = pd.DataFrame({'qid': np.repeat(QIDS, 3), 'docno': [f'd{q * CANDIDATES + j}' for q in range(QUERIES)
                                                            for j in range(3)], 'label': [2, 0, 1] * QUERIES})


def ranking() -> pd.DataFrame:
    """A ranked result frame: CANDIDATES documents per query, with an answer vector per query for LLM DIME."""
    rows = np.arange(QUERIES * CANDIDATES)
    q = rows // CANDIDATES
    scores = np.einsum('ij,ij->i', QUERY_VECS[q], DOC_VECS)
    frame = pd.DataFrame({'qid': np.array(QIDS)[q], 'query': [f'text {i}' for i in q],
                          'query_vec': list(QUERY_VECS[q]), 'docno': [f'd{i}' for i in rows],
                          'doc_vec': list(DOC_VECS), 'score': scores.astype(np.float64),
                          'query_answer_vec': list(QUERY_VECS[q] + 0.5)})
    frame = frame.sort_values(['qid', 'score'], ascending=[True, False], kind='stable').reset_index(drop=True)
    return frame.assign(rank=frame.groupby('qid').cumcount())


def query_frame() -> pd.DataFrame:
    pruned = (PrfDime(keep_ranking=False) >> Rdime())(ranking())
    return pruned[['qid', 'query', 'query_vec']]


STAGES = {
    'PrfDime': (lambda: PrfDime(), ranking),
    'SwcDime': (lambda: SwcDime(), ranking),
    'KernelDime': (lambda: KernelDime(kernel='softmax', num_docs=4, tau=1.0), ranking),
    'MagnitudeDime': (lambda: MagnitudeDime(), ranking),
    'EclipseDime': (lambda: EclipseDime(), ranking),
    'OracleDime': (lambda: OracleDime(qrels=QRELS), ranking),
    'LlmDime': (lambda: LlmDime(), ranking),
    'Rdime': (lambda: PrfDime() >> Rdime(), ranking),
    'TopK': (lambda: SwcDime() >> TopK(fraction=0.5), ranking),
    'VectorScorer': (lambda: PrfDime() >> Rdime() >> VectorScorer(), ranking),
    'LlmAnswers': (lambda: LlmAnswers(answers={'q0': 'an answer', 'q2': 'another'}), ranking),
}


def assert_same(serial: pd.DataFrame, parallel: pd.DataFrame) -> None:
    """Same rows (in any order of queries), same columns, same values (vectors compared element-wise)."""
    key = ['qid', 'docno'] if 'docno' in serial.columns else ['qid']
    serial = serial.sort_values(key, kind='stable').reset_index(drop=True)
    parallel = parallel.sort_values(key, kind='stable').reset_index(drop=True)
    assert list(parallel.columns) == list(serial.columns) and len(parallel) == len(serial)
    for column in serial.columns:
        if isinstance(serial[column].iloc[0], np.ndarray):
            np.testing.assert_array_equal(np.stack(parallel[column]), np.stack(serial[column]), err_msg=column)
        else:
            pd.testing.assert_series_equal(parallel[column], serial[column], check_dtype=False, obj=column)


@pytest.fixture(scope='module')
def flex(tmp_path_factory):
    from pyterrier_dr import FlexIndex
    path = tmp_path_factory.mktemp('parallel') / 'docs.flex'
    index = FlexIndex(str(path), verbose=False)
    docs = np.random.default_rng(5).standard_normal((2000, DIMS)).astype(np.float32)
    index.indexer(mode='overwrite').index({'docno': f'doc{i}', 'doc_vec': v} for i, v in enumerate(docs))
    return index


@pytest.fixture(scope='module')
def ray_local():
    ray = pytest.importorskip('ray', reason='ray is not installed: pip install pyterrier-rdime[ray]')
    os.environ.setdefault('RAY_USAGE_STATS_ENABLED', '0')
    # 'local' starts this test's own Ray even when another process's cluster runs on the machine (ray.init() would
    # join that one, and refuse num_cpus)
    ray.init(address='local', num_cpus=2, include_dashboard=False, object_store_memory=80 * 2 ** 20,
             log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


def backend_fixture(request, backend):
    if backend == 'ray':
        request.getfixturevalue('ray_local')
    return backend


pytestmark = pytest.mark.filterwarnings('ignore:.parallel\\(\\) is experimental')


@pytest.mark.parametrize('name', list(STAGES))
def test_stage_in_parallel_with_joblib(name):
    make, data = STAGES[name]
    stage = make()
    assert repr(pickle.loads(pickle.dumps(stage))) == repr(stage)  # data arguments (qrels) compare by identity
    serial = stage(data())
    assert_same(serial, stage.parallel(2, backend='joblib')(data()))


def test_every_stage_in_one_ray_pipeline(ray_local):
    """One Ray pool for all the stages (each pool start costs seconds on a loaded machine): every stage of the
    chain runs on the workers, each DIME replacing the previous one's query_dime."""
    pipeline = (STAGES['LlmAnswers'][0]() >> PrfDime() >> SwcDime() >> STAGES['KernelDime'][0]() >> MagnitudeDime()
                >> EclipseDime() >> OracleDime(qrels=QRELS) >> LlmDime() >> TopK(fraction=0.5) >> PrfDime()
                >> Rdime() >> VectorScorer())
    serial = pipeline(ranking())
    assert_same(serial, pipeline.parallel(2, backend='ray')(ranking()))


@pytest.mark.parametrize('backend', ['joblib', 'ray'])
def test_pruned_retriever_in_parallel(flex, backend, request):
    backend_fixture(request, backend)
    retriever = PrunedRetriever(index=flex, num_results=20, strategy='pruned')
    serial = retriever(query_frame())
    built = flex.index_path / store.LAYOUT_NAME
    mtime = built.stat().st_mtime_ns
    assert len(pickle.dumps(retriever)) < 4096  # by path: neither the vectors nor the layout travel
    assert_same(serial, retriever.parallel(2, backend=backend)(query_frame()))
    assert built.stat().st_mtime_ns == mtime  # the workers opened the layout, none rebuilt it
