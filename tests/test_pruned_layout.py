"""The on-disk dimension-major layout of a FlexIndex behind PrunedRetriever: shared and built once, atomic, in the
cache folder for a read-only index, never used for vectors it was not built from (size, time or content changed:
rebuilt, with a warning), not trusted after an interrupted build (a temporary file, a truncated layout, a missing
record, a build killed with SIGKILL), NaN documents refused, thread-safe opening."""
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from pruned_data import DIMS, DOCS, K, flex_index, full_topk, make_corpus, query_frame

from pyterrier_rdime import PrunedRetriever
from pyterrier_rdime.pruned import layout


@pytest.fixture(scope='module')
def corpus():
    return make_corpus()


@pytest.fixture
def count_builds(monkeypatch):
    calls = []
    real = layout.build_layout

    def counting(*args, **kwargs):
        calls.append(args[1])
        return real(*args, **kwargs)
    monkeypatch.setattr(layout, 'build_layout', counting)
    return calls


def test_one_layout_per_flex_index(corpus, tmp_path, count_builds):
    from pyterrier_dr import FlexIndex
    docs, query_vecs = corpus
    index = flex_index(tmp_path / 'docs.flex', docs, docnos=[f'doc-{i}' for i in range(DOCS)])
    a = PrunedRetriever(index=index, num_results=K, strategy='pruned')
    b = PrunedRetriever(index=FlexIndex(str(tmp_path / 'docs.flex')), num_results=50, strategy='pruned')
    fused = (a % 5).compile()
    matrix = a.dim_major()
    path = tmp_path / 'docs.flex' / layout.LAYOUT_NAME
    assert isinstance(matrix, np.memmap) and os.path.samefile(matrix.filename, path)
    assert matrix.shape == (DIMS, DOCS) and not matrix.flags.writeable
    np.testing.assert_array_equal(matrix, docs.T)
    np.testing.assert_array_equal(a._layout.abs_max(), np.abs(docs).max(axis=0))
    assert b.dim_major() is matrix and fused.dim_major() is matrix  # the same map: no second copy
    assert count_builds == [path]  # built once
    mtime = path.stat().st_mtime_ns
    # another process (here: an unpickled copy, whose layout holder is new) opens the same file, without a rebuild
    clone = pickle.loads(pickle.dumps(b))
    assert clone == b and clone.index is not b.index  # equal by index path
    assert os.path.samefile(clone.dim_major().filename, path) and count_builds == [path]
    assert path.stat().st_mtime_ns == mtime
    out = clone(query_frame(query_vecs[:2]))
    assert out[out['qid'] == 'q0']['docno'].tolist() == [f'doc-{i}' for i in full_topk(docs, query_vecs[0], 50)[1]]
    assert not list((tmp_path / 'docs.flex').glob('*.tmp'))


def test_layout_rebuilt_when_the_index_changes(corpus, tmp_path, count_builds):
    docs, query_vecs = corpus
    first = PrunedRetriever(index=flex_index(tmp_path / 'x.flex', docs[:100]), num_results=3)
    assert first.dim_major().shape == (DIMS, 100)
    index = flex_index(tmp_path / 'x.flex', docs[:200])  # overwritten: the folder and its layout are replaced
    retriever = PrunedRetriever(index=index, num_results=3, strategy='pruned')
    np.testing.assert_array_equal(retriever.dim_major(), docs[:200].T)
    assert len(count_builds) == 2
    # vectors appended in place (the layout of 200 documents stays beside 300): the layout no longer fits
    with open(tmp_path / 'x.flex' / 'vecs.f4', 'ab') as f:
        f.write(docs[200:300].tobytes())
    meta = tmp_path / 'x.flex' / 'pt_meta.json'
    meta.write_text(meta.read_text().replace('"doc_count": 200', '"doc_count": 300'))
    from pyterrier_dr import FlexIndex
    with pytest.warns(UserWarning, match=r'rebuilding the dimension-major layout .*x.flex/rdime.dim_major.npy: it is '
                                         r'incomplete or not a float32 \(48, 300\) matrix'):
        matrix = PrunedRetriever(index=FlexIndex(str(tmp_path / 'x.flex'))).dim_major()
    np.testing.assert_array_equal(matrix, docs[:300].T)
    assert len(count_builds) == 3


def test_layout_rebuilt_when_the_content_changes_but_size_and_time_do_not(corpus, tmp_path, count_builds):
    docs, _ = corpus
    index = flex_index(tmp_path / 'c.flex', docs[:300])
    np.testing.assert_array_equal(PrunedRetriever(index=index).dim_major(), docs[:300].T)
    source = tmp_path / 'c.flex' / 'vecs.f4'
    stat = source.stat()
    other = docs[300:600]  # same shape, other vectors: written in place, the old times put back
    with open(source, 'r+b') as f:
        f.write(other.tobytes())
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert source.stat().st_mtime_ns == stat.st_mtime_ns and source.stat().st_size == stat.st_size
    layout._OPEN.clear()  # a new process: nothing opened yet
    with pytest.warns(UserWarning, match=r'built from other vectors than .*vecs.f4 \(size, modification time or '
                                         r'content changed\)'):
        matrix = PrunedRetriever(index=index).dim_major()
    np.testing.assert_array_equal(matrix, other.T)
    assert len(count_builds) == 2


def test_layout_of_a_read_only_index_goes_to_the_cache(corpus, tmp_path, monkeypatch, count_builds):
    docs, _ = corpus
    index = flex_index(tmp_path / 'ro.flex', docs[:300])
    monkeypatch.setenv('PYTERRIER_RDIME_CACHE', str(tmp_path / 'cache'))
    folder = str(tmp_path / 'ro.flex')
    real_access = os.access
    monkeypatch.setattr(layout.os, 'access', lambda p, mode: False if str(p) == folder else real_access(p, mode))
    matrix = PrunedRetriever(index=index).dim_major()
    assert os.path.dirname(matrix.filename) == str(tmp_path / 'cache' / 'layouts')
    assert os.path.basename(matrix.filename).startswith('ro.flex-')
    assert layout.record_path(layout.Path(matrix.filename)).is_file()
    assert not (tmp_path / 'ro.flex' / layout.LAYOUT_NAME).exists()
    np.testing.assert_array_equal(matrix, docs[:300].T)


def test_interrupted_or_partial_layouts_are_not_trusted(corpus, tmp_path, monkeypatch, count_builds):
    docs, _ = corpus
    bad = docs[:300].copy()
    bad[170, 5] = np.nan
    index = flex_index(tmp_path / 'nan.flex', bad, docnos=[f'doc-{i}' for i in range(300)])
    monkeypatch.setattr(layout, 'BUILD_BLOCK', 64)  # the NaN document is in the third block: two were written
    with pytest.raises(ValueError, match=r"PrunedRetriever: document 'doc-170' \(docid 170\) of .*nan.flex has NaN"):
        PrunedRetriever(index=index).dim_major()
    assert not (tmp_path / 'nan.flex' / layout.LAYOUT_NAME).exists()
    assert not list((tmp_path / 'nan.flex').glob('.*.tmp'))
    # a build killed mid-way leaves a temporary file (never opened, removed by the next build) or, written by
    # something else, a truncated layout: both are rebuilt
    index = flex_index(tmp_path / 'ok.flex', docs[:300])
    folder = tmp_path / 'ok.flex'
    (folder / f'.{layout.LAYOUT_NAME}.killed.tmp').write_bytes(b'partial')
    with open(folder / layout.LAYOUT_NAME, 'wb') as f:
        np.lib.format.write_array_header_1_0(f, {'descr': '<f4', 'fortran_order': False, 'shape': (DIMS, 300)})
        f.write(b'\0' * 100)
    with pytest.warns(UserWarning, match='incomplete'):
        matrix = PrunedRetriever(index=index).dim_major()
    np.testing.assert_array_equal(matrix, docs[:300].T)
    assert not list(folder.glob('.*.tmp')) and len(count_builds) == 2
    # killed after the layout was renamed into place but before its record was: a complete-looking layout whose
    # content was never vouched for
    path = folder / layout.LAYOUT_NAME
    layout.record_path(path).unlink()
    layout._OPEN.clear()
    with pytest.warns(UserWarning, match='record rdime.dim_major.json is missing'):
        np.testing.assert_array_equal(PrunedRetriever(index=index).dim_major(), docs[:300].T)
    assert len(count_builds) == 3


KILLED_BUILD = '''
import sys, time
from pyterrier_dr import FlexIndex
from pyterrier_rdime import PrunedRetriever
from pyterrier_rdime.pruned import layout
layout.BUILD_BLOCK = 16
check = layout._check_finite
def slow(rows, start, *args):
    if start == 32:
        print('building', flush=True)
    time.sleep(0.05)
    check(rows, start, *args)
layout._check_finite = slow
PrunedRetriever(index=FlexIndex(sys.argv[1])).dim_major()
print('finished', flush=True)
'''


def test_a_build_killed_with_sigkill_leaves_nothing_used(corpus, tmp_path, count_builds):
    docs, _ = corpus
    index = flex_index(tmp_path / 'kill.flex', docs[:1000])
    child = subprocess.Popen([sys.executable, '-c', textwrap.dedent(KILLED_BUILD), str(tmp_path / 'kill.flex')],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == 'building'  # three blocks of 16 written, 60 to go (~3 s)
        time.sleep(0.1)
        assert child.poll() is None
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL
    folder = tmp_path / 'kill.flex'
    assert list(folder.glob('.*.tmp')) and not (folder / layout.LAYOUT_NAME).exists()  # only the partial file
    matrix = PrunedRetriever(index=index).dim_major()
    np.testing.assert_array_equal(matrix, docs[:1000].T)
    assert not list(folder.glob('.*.tmp')) and len(count_builds) == 1


def test_nan_in_an_array_index_names_the_docno(corpus):
    docs, query_vecs = corpus
    bad = docs.copy()
    bad[42, 0] = np.inf
    retriever = PrunedRetriever(index=bad, docnos=[f'doc-{i}' for i in range(DOCS)])
    with pytest.raises(ValueError, match=r"document 'doc-42' \(docid 42\) of the array index has NaN or infinite"):
        retriever(query_frame(query_vecs[:1]))
    with pytest.raises(ValueError, match=r"document '42'"):
        PrunedRetriever(index=np.asfortranarray(bad)).dim_major()


def test_lazy_initialisation_is_thread_safe(corpus, tmp_path, count_builds):
    docs, _ = corpus
    index = flex_index(tmp_path / 't.flex', docs[:500])
    for retriever in (PrunedRetriever(index=index), PrunedRetriever(index=docs[:500])):
        barrier, got = threading.Barrier(4), []

        def open_matrix(r=retriever):
            barrier.wait()
            got.append(r.dim_major())
        threads = [threading.Thread(target=open_matrix) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(got) == 4 and all(m is got[0] for m in got)
    assert len(count_builds) == 1  # the FlexIndex's file; the array's copy is built in memory
