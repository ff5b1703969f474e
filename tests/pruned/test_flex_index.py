"""flex_index_complete: a FlexIndex folder left half written by an interrupted indexing run is told apart from a whole
index (pyterrier-dr's ``built()`` accepts both), and ``mode='overwrite'`` then rebuilds it."""
import json

import numpy as np
import pytest

from pyterrier_rdime import flex_index_complete, flex_index_problem

pyterrier_dr = pytest.importorskip('pyterrier_dr')


def _docs(n, fail_at=None):
    for i in range(n):
        if i == fail_at:
            raise KeyboardInterrupt  # what Ctrl-C during the encoding raises inside the indexer's loop
        yield {'docno': f'd{i}', 'doc_vec': np.full(3, i, dtype=np.float32)}


def test_an_interrupted_run_leaves_a_folder_built_accepts_but_that_is_not_complete(tmp_path):
    index = pyterrier_dr.FlexIndex(str(tmp_path / 'x.flex'), verbose=False)
    with pytest.raises(KeyboardInterrupt):
        index.indexer().index(_docs(5, fail_at=3))
    assert index.built()  # pyterrier-dr's check: the folder exists
    assert not flex_index_complete(index)
    assert 'pt_meta.json' in flex_index_problem(index)
    index.indexer(mode='overwrite').index(_docs(5))  # the README's rebuild replaces the half-written folder
    assert flex_index_complete(index) and flex_index_problem(str(index.index_path)) is None
    assert len(index) == 5


def test_missing_folder_truncated_vectors_and_a_damaged_record_are_named(tmp_path):
    assert not flex_index_complete(tmp_path / 'none.flex')
    assert 'does not exist' in flex_index_problem(tmp_path / 'none.flex')
    index = pyterrier_dr.FlexIndex(str(tmp_path / 'y.flex'), verbose=False)
    index.indexer().index(_docs(4))
    vecs = tmp_path / 'y.flex' / 'vecs.f4'
    vecs.write_bytes(vecs.read_bytes()[:-4])  # 4 docs x 3 dims x 4 bytes = 48, one value short
    assert '44 bytes, not the 48' in flex_index_problem(index)
    (tmp_path / 'y.flex' / 'pt_meta.json').write_text(json.dumps({'vec_size': 3}))
    assert 'does not read as a FlexIndex record' in flex_index_problem(index)


def test_pruned_retriever_on_a_half_written_index_says_how_to_rebuild_it(tmp_path):
    from pyterrier_rdime import PrunedRetriever
    index = pyterrier_dr.FlexIndex(str(tmp_path / 'half.flex'), verbose=False)
    with pytest.raises(KeyboardInterrupt):
        index.indexer().index(_docs(5, fail_at=3))
    with pytest.raises(ValueError, match=r"PrunedRetriever: .* is not built \(.*half.flex lacks pt_meta.json .*\); .*"
                                         r"indexer\(mode='overwrite'\)\)\.index\(docs\), which also replaces a folder"):
        PrunedRetriever(index=index, num_results=2).search(np.ones((1, 3), dtype=np.float32))
    with pytest.raises(RuntimeError, match='already exists'):  # why the fix needs mode='overwrite'
        index.indexer().index(_docs(5))
