"""The on-disk dimension-major layout of a FlexIndex behind PrunedRetriever: shared and built once, atomic, in the
cache folder for a read-only index, never used for vectors or docnos it was not built from (size or content changed,
including one row rewritten in place with its mtime put back: rebuilt, with a warning; new times on the same content:
hashed once, kept), not trusted after an interrupted build (a temporary file, a truncated layout, a missing record, a
build killed with SIGKILL), NaN documents and repeated docnos refused (checked once per build), thread-safe
opening; the progress bars of a first search (layout, calibration), on by default."""
import json
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

from pyterrier_rdime import PrunedRetriever, store
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
    path = tmp_path / 'docs.flex' / store.LAYOUT_NAME
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
    from npids import Lookup
    from pyterrier_dr import FlexIndex
    (tmp_path / 'x.flex' / 'docnos.npids').unlink()
    Lookup.build([f'd{i}' for i in range(300)], tmp_path / 'x.flex' / 'docnos.npids')
    with pytest.warns(UserWarning, match=r'rebuilding the dimension-major layout .*x.flex/rdime.dim_major.npy: it is '
                                         r'incomplete or not a float32 \(48, 300\) matrix'):
        matrix = PrunedRetriever(index=FlexIndex(str(tmp_path / 'x.flex'))).dim_major()
    np.testing.assert_array_equal(matrix, docs[:300].T)
    assert len(count_builds) == 3


def test_a_row_rewritten_in_place_with_its_mtime_put_back_rebuilds_the_layout(tmp_path, count_builds):
    # the case of issue 22: one row of vecs.f4 rewritten in place, outside the three MiB (start, middle, end) that
    # an earlier fingerprint sampled, and its mtime put back; only the inode change time and the content tell
    docs = np.random.default_rng(1).standard_normal((1500, 768)).astype(np.float32)  # 4.4 MiB of vectors
    index = flex_index(tmp_path / 'c.flex', docs)
    query = np.zeros((1, 768), dtype=np.float32)
    query[0, :3] = 1
    top5 = PrunedRetriever(index=index, num_results=5, strategy='pruned')(query_frame(query))['docid'].tolist()
    assert top5 == full_topk(docs, query[0], 5)[1].tolist()
    source = tmp_path / 'c.flex' / 'vecs.f4'
    stat, row, mib = source.stat(), 450, 2 ** 20
    offset = row * 768 * 4
    middle = stat.st_size // 2 - mib // 2
    assert mib <= offset and offset + 768 * 4 <= middle  # outside the sampled MiB
    docs[row] = 0
    docs[row, :3] = 100  # now the best document of the query
    with open(source, 'r+b') as f:
        f.seek(offset)
        f.write(docs[row].tobytes())
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    now = source.stat()
    assert (now.st_mtime_ns, now.st_size, now.st_ino) == (stat.st_mtime_ns, stat.st_size, stat.st_ino)
    store._OPENED.clear()  # a new process: nothing opened yet
    with pytest.warns(UserWarning, match=r'rebuilding the dimension-major layout .*c.flex/rdime.dim_major.npy: '
                                         r'.*c.flex/vecs.f4 changed since it was built \(its content: '
                                         r'SHA-256\)'):
        out = PrunedRetriever(index=index, num_results=5, strategy='pruned')(query_frame(query))
    assert out['docid'].tolist() == full_topk(docs, query[0], 5)[1].tolist() and out['docid'].iloc[0] == row
    assert len(count_builds) == 2


def test_same_content_with_new_times_is_hashed_once_and_not_rebuilt(corpus, tmp_path, monkeypatch, count_builds):
    docs, _ = corpus
    index = flex_index(tmp_path / 't.flex', docs[:300])
    np.testing.assert_array_equal(PrunedRetriever(index=index).dim_major(), docs[:300].T)
    hashed = []
    real = store.fingerprint
    monkeypatch.setattr(store, 'fingerprint', lambda source: hashed.append(source.name) or real(source))
    record = (tmp_path / 't.flex' / store.LAYOUT_NAME).with_suffix('.json')
    before = store.read_json(record, 'layout')['sources']
    source = tmp_path / 't.flex' / 'vecs.f4'
    os.chmod(source, 0o444)  # a new ctime; touch, cp -a or mv give new times or a new inode the same way
    os.utime(source)
    for _ in range(2):
        store._OPENED.clear()
        np.testing.assert_array_equal(PrunedRetriever(index=index).dim_major(), docs[:300].T)
    assert hashed == ['vecs.f4'] and len(count_builds) == 1  # the first open verified the content and recorded
    after = store.read_json(record, 'layout')['sources']
    assert after['vecs.f4']['ctime_ns'] == source.stat().st_ctime_ns != before['vecs.f4']['ctime_ns']
    assert after['vecs.f4']['sha256'] == before['vecs.f4']['sha256'] and after['docnos.npids'] == before['docnos.npids']


def test_the_docnos_are_checked_when_the_layout_is_built(corpus, tmp_path, monkeypatch, count_builds):
    docs, query_vecs = corpus
    with pytest.raises(ValueError, match=r"PrunedRetriever: docno 'd1' names more than one document of "
                                         r'.*dup.flex \(docids 1 and 4\)'):
        PrunedRetriever(index=flex_index(tmp_path / 'dup.flex', docs[:5], docnos=['d0', 'd1', 'd2', 'd3', 'd1'])
                        ).dim_major()
    assert not (tmp_path / 'dup.flex' / store.LAYOUT_NAME).exists() and count_builds == []
    checks = []
    real = layout.check_unique_docnos
    monkeypatch.setattr(layout, 'check_unique_docnos', lambda *a, **k: checks.append(a[1]) or real(*a, **k))
    index = flex_index(tmp_path / 'ok.flex', docs[:300])
    for _ in range(2):  # once per build, not per open or per query
        store._OPENED.clear()
        PrunedRetriever(index=index, num_results=3, strategy='pruned')(query_frame(query_vecs[:2]))
    assert checks == [300]
    # other docnos over the same vectors (same size, as a re-index of the same documents renamed): rebuilt, checked
    from npids import Lookup
    from pyterrier_dr import FlexIndex
    npids = tmp_path / 'ok.flex' / 'docnos.npids'
    npids.unlink()
    Lookup.build([f'e{i}' for i in range(300)], npids)
    store._OPENED.clear()
    with pytest.warns(UserWarning, match=r'layout .*docnos.npids changed since it was built'):
        out = PrunedRetriever(index=FlexIndex(str(tmp_path / 'ok.flex')), num_results=3,
                              strategy='pruned')(query_frame(query_vecs[:1]))
    assert checks == [300, 300] and out['docno'].str.startswith('e').all()


def test_a_repeated_docno_is_found_across_blocks_and_hash_collisions(monkeypatch):
    docnos = np.array(['a', 'b', 'c', 'd', 'e', 'c', 'f'], dtype=object)
    monkeypatch.setattr(layout, 'DOCNO_BLOCK', 2)  # 'c' at docids 2 and 5, in the second and third blocks
    with pytest.raises(ValueError, match=r"S: docno 'c' names more than one document of the test \(docids 2 and 5\), "
                                         r'so a ranking could hold it twice; fix it'):
        layout.check_unique_docnos(docnos.__getitem__, len(docnos), stage='S', source='the test', fix='fix it')
    monkeypatch.setattr(layout.pd.util, 'hash_array', lambda values, categorize: np.zeros(len(values), np.uint64))
    layout.check_unique_docnos(np.delete(docnos, 5).__getitem__, 6, stage='S', source='the test', fix='')  # collide
    with pytest.raises(ValueError, match=r"S: docno 'c' .*\(docids 2 and 5\)"):
        layout.check_unique_docnos(docnos.__getitem__, len(docnos), stage='S', source='the test', fix='')


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
    assert layout.Path(matrix.filename).with_suffix('.json').is_file()
    assert not (tmp_path / 'ro.flex' / store.LAYOUT_NAME).exists()
    np.testing.assert_array_equal(matrix, docs[:300].T)


def test_interrupted_or_partial_layouts_are_not_trusted(corpus, tmp_path, monkeypatch, count_builds):
    docs, _ = corpus
    bad = docs[:300].copy()
    bad[170, 5] = np.nan
    index = flex_index(tmp_path / 'nan.flex', bad, docnos=[f'doc-{i}' for i in range(300)])
    monkeypatch.setattr(layout, 'BUILD_BLOCK', 64)  # the NaN document is in the third block: two were written
    with pytest.raises(ValueError, match=r"PrunedRetriever: document 'doc-170' \(docid 170\) of .*nan.flex has NaN"):
        PrunedRetriever(index=index).dim_major()
    assert not (tmp_path / 'nan.flex' / store.LAYOUT_NAME).exists()
    assert not list((tmp_path / 'nan.flex').glob('.*.tmp'))
    # a build killed mid-way leaves a temporary file (never opened, removed by the next build) or, written by
    # something else, a truncated layout: both are rebuilt
    index = flex_index(tmp_path / 'ok.flex', docs[:300])
    folder = tmp_path / 'ok.flex'
    (folder / f'.{store.LAYOUT_NAME}.killed.tmp').write_bytes(b'partial')
    with open(folder / store.LAYOUT_NAME, 'wb') as f:
        np.lib.format.write_array_header_1_0(f, {'descr': '<f4', 'fortran_order': False, 'shape': (DIMS, 300)})
        f.write(b'\0' * 100)
    with pytest.warns(UserWarning, match='record rdime.dim_major.json is missing'):
        matrix = PrunedRetriever(index=index).dim_major()
    np.testing.assert_array_equal(matrix, docs[:300].T)
    assert not list(folder.glob('.*.tmp')) and len(count_builds) == 2
    # killed after the layout was renamed into place but before its record was: a complete-looking layout whose
    # content was never vouched for
    path = folder / store.LAYOUT_NAME
    path.with_suffix('.json').unlink()
    store._OPENED.clear()
    with pytest.warns(UserWarning, match='record rdime.dim_major.json is missing'):
        np.testing.assert_array_equal(PrunedRetriever(index=index).dim_major(), docs[:300].T)
    assert len(count_builds) == 3
    # a record of an earlier version (plain JSON), or whose fingerprint was cut short: not trusted
    def short(record):
        return {**record, 'sources': {**record['sources'], 'vecs.f4': {'size': 300 * DIMS * 4, 'sha256': '0'}}}
    for write, message in ((lambda record: path.with_suffix('.json').write_text(json.dumps(record)), 'not a record'),
                           (lambda record: store.write_json(path.with_suffix('.json'), 'layout', short(record)),
                            'changed since')):
        write(store.read_json(path.with_suffix('.json'), 'layout'))
        store._OPENED.clear()
        with pytest.warns(UserWarning, match=message):
            np.testing.assert_array_equal(PrunedRetriever(index=index).dim_major(), docs[:300].T)
    assert len(count_builds) == 5


KILLED_BUILD = '''
import sys, time
from pyterrier_dr import FlexIndex
from pyterrier_rdime import PrunedRetriever
from pyterrier_rdime.pruned import layout
layout.BUILD_BLOCK = 16
check = layout.check_finite
def slow(rows, start, *args):
    if start == 32:
        print('building', flush=True)
    time.sleep(0.05)
    check(rows, start, *args)
layout.check_finite = slow
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
    assert list(folder.glob('.*.tmp')) and not (folder / store.LAYOUT_NAME).exists()  # only the partial file
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


def test_the_document_rows_the_layout_was_made_from(tmp_path):
    rng = np.random.default_rng(4)
    docs = rng.standard_normal((50, 6)).astype(np.float32)
    assert layout.Layout(docs).doc_rows() is docs  # C-contiguous float32: the rows themselves
    assert layout.Layout(docs.astype(np.float64)).doc_rows() is None  # not the float32 values the matrix holds
    assert layout.Layout(np.asfortranarray(docs)).doc_rows() is None  # rows not contiguous
    rows = layout.Layout(flex_index(tmp_path / 'docs.flex', docs)).doc_rows()
    assert rows.dtype == np.float32 and rows.flags.c_contiguous and rows.tolist() == docs.tolist()


def test_the_first_search_shows_its_one_off_steps_by_default(corpus, tmp_path, capfd):
    docs, queries = corpus
    index = flex_index(tmp_path / 'bar.flex', docs[:300])
    PrunedRetriever(index=index, num_results=3, strategy='pruned')(query_frame(queries[:1]))
    assert 'PrunedRetriever layout' in capfd.readouterr().err  # the layout is built: a bar, as pt.tqdm draws it
    PrunedRetriever(index=index, num_results=3, strategy='pruned')(query_frame(queries[:1]))
    assert capfd.readouterr().err == ''  # the layout exists: a search itself shows nothing
    quiet = flex_index(tmp_path / 'quiet.flex', docs[:300])
    PrunedRetriever(index=quiet, num_results=3, strategy='pruned', verbose=False)(query_frame(queries[:1]))
    assert capfd.readouterr().err == ''


def test_calibration_shows_its_progress_when_verbose(capfd):
    from pyterrier_rdime.pruned import calibration
    pytest.importorskip('numba')
    calibration.calibrate(docs=512, rounds=1, save=False, verbose=True)
    assert 'PrunedRetriever calibration' in capfd.readouterr().err
    calibration.calibrate(docs=512, rounds=1, save=False)
    assert 'PrunedRetriever calibration' not in capfd.readouterr().err


def test_docnos_of_repeated_unsorted_and_no_docids(tmp_path):
    # each distinct docid is looked up once and put back at every place it takes; none gives an empty array
    docnos = [f'doc-{i * 7 % 11}-{i}' for i in range(11)]
    index = flex_index(tmp_path / 'index.flex', np.eye(11, 4, dtype=np.float32), docnos)
    lookup = layout.Layout(index).lookup_docnos
    docids = np.array([9, 2, 9, 0, 10, 2, 2])
    got = lookup(docids)
    assert got.dtype == object and got.tolist() == [docnos[i] for i in docids]
    assert lookup(np.empty(0, dtype=np.int64)).tolist() == []
