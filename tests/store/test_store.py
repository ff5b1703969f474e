"""The one store of derived files (pyterrier_rdime.store) and the cracks it closes: a damaged or wrongly typed
progress record is recomputed with a warning; a float32 layout edited in place with its mtime put back is rebuilt;
a retriever opened before its vectors were edited in place follows the edit on its next call, on every path; a
measured-timings record holding strings is ignored and rewritten; a failed write of the layout (disk full) does not
block the next build; an inf in a document's vector is named by its docno."""
import errno
import hashlib
import logging
import os
import warnings

import numpy as np
import pandas as pd
import pytest
from pruned_data import flex_index, full_topk, make_corpus, query_frame

from pyterrier_rdime import PrunedRetriever, store, threshold
from pyterrier_rdime.experiment.systems import SystemRecords
from pyterrier_rdime.pruned import planner

KEY = ('frames', 'prf/RDIME')


def test_a_record_checks_its_kind_length_and_checksum(tmp_path):
    path = tmp_path / 'r.json'
    store.write_json(path, 'thing', {'a': [1, 2.5]})
    assert store.read_json(path, 'thing') == {'a': [1, 2.5]}
    with pytest.raises(store.Damaged, match="a record of 'thing', not of 'other'"):
        store.read_json(path, 'other')
    data = path.read_bytes()
    path.write_bytes(data.replace(b'2.5', b'2.6'))  # one value edited
    with pytest.raises(store.Damaged, match='fails its checksum'):
        store.read_json(path, 'thing')
    path.write_bytes(data[:-3])  # cut short
    with pytest.raises(store.Damaged, match='fails its checksum'):
        store.read_json(path, 'thing')
    path.write_text('{"a": [1, 2.5]}')  # plain JSON: an earlier version, or written by hand
    with pytest.raises(store.Damaged, match='not a record of this version'):
        store.read_json(path, 'thing')
    with pytest.raises(store.Damaged, match='missing'):
        store.read_json(tmp_path / 'none.json', 'thing')


def _frame():
    return pd.DataFrame({'qid': ['1'] * 4 + ['2'] * 4, 'docno': list('abcdabcd'), 'score': np.arange(8) / 4})


@pytest.mark.parametrize('damage', ['32 random bytes', 'one score'])
def test_a_damaged_progress_record_is_recomputed_with_a_warning(tmp_path, caplog, damage):
    frame, computed = _frame(), []
    SystemRecords(tmp_path, 'k').frame(KEY, lambda: frame)
    record = next(tmp_path.glob('k/*'))
    data = bytearray(record.read_bytes())
    scores = frame['score'].to_numpy().tobytes()
    at = bytes(data).find(scores)
    assert at > 0  # the scores' bytes lie inside the record
    if damage == 'one score':
        data[at:at + 8] = np.float64(9.0).tobytes()
    else:
        data[at + 8:at + 40] = np.random.default_rng(0).bytes(32)
    record.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        again = SystemRecords(tmp_path, 'k').frame(KEY, lambda: computed.append(1) or frame)
    assert computed == [1] and 'does not read back' in caplog.text
    pd.testing.assert_frame_equal(again, frame)


def test_a_progress_record_of_the_wrong_type_is_recomputed_with_a_warning(tmp_path, caplog):
    SystemRecords(tmp_path, 'k')._write(KEY, ['not', 'a', 'frame'])
    computed = []
    with caplog.at_level(logging.WARNING):
        again = SystemRecords(tmp_path, 'k').frame(KEY, lambda: computed.append(1) or _frame())
    assert computed == [1] and 'does not read back' in caplog.text
    pd.testing.assert_frame_equal(again, _frame())


def _edit_rows(path, offset, values, *, keep_mtime):
    stat = path.stat()
    with open(path, 'r+b') as f:
        f.seek(offset)
        f.write(np.asarray(values, dtype=np.float32).tobytes())
    if keep_mtime:
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # touch -r: only the ctime tells


def test_a_layout_edited_in_place_with_its_mtime_put_back_is_rebuilt(tmp_path):
    from pyterrier_dr import FlexIndex
    docs, query_vecs = make_corpus()
    index = flex_index(tmp_path / 'e.flex', docs)
    query = query_frame(query_vecs[:1])
    before = PrunedRetriever(index=index, num_results=5, strategy='pruned', verbose=False)(query)
    assert before['docid'].tolist() == full_topk(docs, query_vecs[0], 5)[1].tolist()
    layout = tmp_path / 'e.flex' / 'rdime.dim_major.npy'
    header = layout.stat().st_size - docs.nbytes
    worst = int(full_topk(docs, query_vecs[0], len(docs))[1][-1])
    _edit_rows(layout, header + worst * 4, [1000.0], keep_mtime=True)  # dimension 0 of the worst document
    with pytest.warns(UserWarning, match='rebuilding the dimension-major layout .*not the file its record describes'):
        after = PrunedRetriever(index=FlexIndex(str(tmp_path / 'e.flex')), num_results=5, strategy='pruned',
                                verbose=False)(query)
    assert after['docid'].tolist() == before['docid'].tolist()


def test_an_open_retriever_follows_its_vectors_edited_in_place_on_every_path(tmp_path):
    docs, query_vecs = make_corpus()
    index = flex_index(tmp_path / 'o.flex', docs)
    query = query_frame(query_vecs[:1])
    retrievers = {strategy: PrunedRetriever(index=index, num_results=5, strategy=strategy, verbose=False)
                  for strategy in ('pruned', 'compressed', 'dense')}
    for retriever in retrievers.values():
        assert retriever(query)['docid'].tolist() == full_topk(docs, query_vecs[0], 5)[1].tolist()
    edited = docs.copy()
    worst = int(full_topk(docs, query_vecs[0], len(docs))[1][-1])
    edited[worst] = 3 * np.sign(query_vecs[0])  # now the best document of the query
    _edit_rows(tmp_path / 'o.flex' / 'vecs.f4', worst * docs.shape[1] * 4, edited[worst], keep_mtime=True)
    expected = full_topk(edited, query_vecs[0], 5)[1].tolist()
    assert expected[0] == worst
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # each derived file says it is rebuilt
        for strategy, retriever in retrievers.items():
            assert retriever(query)['docid'].tolist() == expected, strategy


def test_a_measured_timings_record_holding_strings_is_ignored_and_rewritten(tmp_path):
    path = tmp_path / 'measured.json'
    path.write_text('{"buckets": {"b": {"calls": 3, "seconds_per_unit": {"dense": ["x"], "compressed": ["y"]}}}}')
    choice = planner.MeasuredChoice(lambda: path, clock=iter(range(100)).__next__)
    costs = {'dense': 1.0, 'compressed': 1.2}
    first = planner.measured_choice(costs, 'b', choice)
    assert first.reason == 'explore' and first.path == 'dense'
    for _ in range(2):  # the first run of a path is cold, not recorded; the second is, and the record rewritten
        choice.timed(first, lambda: None)
    assert store.read_json(path, 'measured-timings')['buckets']['b']['seconds_per_unit'] == {'dense': [1.0]}
    store.write_json(path, 'measured-timings', {'buckets': {'b': {'calls': 1, 'seconds_per_unit': {'dense': ['x']}}}})
    again = planner.MeasuredChoice(lambda: path)
    assert planner.measured_choice(costs, 'b', again).reason == 'explore'  # checks, but not timings


def test_a_failed_write_of_the_layout_does_not_block_the_next_build(tmp_path, monkeypatch):
    """The layout written, then the disk full before its record; once space is freed, the disk holds one layout:
    the next build must not need room for a second copy beside the unusable one."""
    docs, query_vecs = make_corpus()
    index = flex_index(tmp_path / 'f.flex', docs)
    folder = tmp_path / 'f.flex'
    real_replace, real_pwrite = os.replace, os.pwrite

    def full_before_the_record(src, dst):
        if os.path.basename(dst) == 'rdime.dim_major.json':
            raise OSError(errno.ENOSPC, 'No space left on device')
        return real_replace(src, dst)

    def room_for_one_layout(fd, data, offset):
        if (folder / 'rdime.dim_major.npy').exists():
            raise OSError(errno.ENOSPC, 'No space left on device')
        return real_pwrite(fd, data, offset)
    monkeypatch.setattr(os, 'replace', full_before_the_record)
    monkeypatch.setattr(os, 'pwrite', room_for_one_layout)
    retriever = PrunedRetriever(index=index, num_results=5, strategy='pruned', verbose=False)
    with pytest.raises(OSError, match='No space left'):
        retriever(query_frame(query_vecs[:1]))
    monkeypatch.setattr(os, 'replace', real_replace)  # space freed
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        out = PrunedRetriever(index=index, num_results=5, strategy='pruned', verbose=False)(query_frame(query_vecs[:1]))
    assert out['docid'].tolist() == full_topk(docs, query_vecs[0], 5)[1].tolist()
    assert not list(folder.glob('.*.tmp'))


def test_an_infinite_value_is_named_by_the_docno_of_its_document(tmp_path):
    docs, query_vecs = make_corpus()
    docs = docs[:1000].copy()
    docs[777, 3] = np.inf
    index = flex_index(tmp_path / 'inf.flex', docs, docnos=[f'doc-{i}' for i in range(1000)])
    for search in (lambda: PrunedRetriever(index=index, verbose=False)(query_frame(query_vecs[:1])),
                   lambda: threshold.document_variance(index)):
        with pytest.raises(ValueError, match=r"document 'doc-777' \(docid 777\) of .*inf.flex has NaN or infinite"):
            search()


def test_threads_opening_a_file_built_meanwhile_share_one_opened_value(tmp_path):
    """One thread builds the file; another comes once its record is written, before the builder has opened it: both
    must get the one opened value (the first registered), not one each."""
    import threading
    (tmp_path / 'source').write_bytes(b'vectors')
    builder_opening, other_done = threading.Event(), threading.Event()

    def build(path):
        path.write_bytes(b'derived')
        return {'built': True}

    def open_with(path, content):
        if threading.current_thread() is builder:
            builder_opening.set()
            assert other_done.wait(60)
        return object()
    args = dict(folder=tmp_path, sources=['source'], build=build, open_with=open_with, what='test file', stage='test')
    got = {}
    builder = threading.Thread(target=lambda: got.setdefault('builder', store.derived(tmp_path / 'file', 'test',
                                                                                      **args)))
    builder.start()
    assert builder_opening.wait(60)
    got['other'] = store.derived(tmp_path / 'file', 'test', **args)
    other_done.set()
    builder.join(60)
    assert got['builder'] is got['other']
    assert store.derived(tmp_path / 'file', 'test', **args) is got['other']


def test_prefetch_asks_the_kernel_for_each_listed_row_once(tmp_path, monkeypatch):
    # a memory map 16 bytes into its file: each distinct row's 3 x 4 bytes from there, in file order; an array in
    # memory asks for nothing, nor a file that the page cache holds whole (here: any, at the default share)
    path = tmp_path / 'vecs.f4'
    path.write_bytes(bytes(16) + np.arange(30, dtype=np.float32).tobytes())
    rows = np.memmap(path, dtype=np.float32, mode='r', offset=16, shape=(10, 3))
    monkeypatch.setattr(store, 'OUT_OF_CORE_SHARE', 0)
    store.prefetch_rows(rows, np.array([9, 3]))  # the kernel's own posix_fadvise takes these ranges
    asked = []
    monkeypatch.setattr(os, 'posix_fadvise', lambda fd, offset, length, advice: asked.append((offset, length, advice)))
    store.prefetch_rows(rows, np.array([7, 2, 7, 0]))
    assert asked == [(16, 12, os.POSIX_FADV_WILLNEED), (16 + 24, 12, os.POSIX_FADV_WILLNEED),
                     (16 + 84, 12, os.POSIX_FADV_WILLNEED)]
    asked.clear()
    store.prefetch_rows(np.asarray(rows), np.array([1]))
    monkeypatch.setattr(store, 'OUT_OF_CORE_SHARE', 0.5)
    store.prefetch_rows(rows, np.array([1]))
    assert asked == []



def test_a_large_files_hash_is_kept_for_the_next_process_while_its_stat_holds(tmp_path, monkeypatch):
    monkeypatch.setenv('PYTERRIER_RDIME_CACHE', str(tmp_path / 'cache'))
    monkeypatch.setattr(store, 'KEPT_HASH_BYTES', 8)
    big, small = tmp_path / 'vecs.f4', tmp_path / 'small'
    big.write_bytes(b'0123456789')
    small.write_bytes(b'0123')
    assert store.fingerprint(big)['sha256'] == hashlib.sha256(b'0123456789').hexdigest()
    assert store.fingerprint(small)['sha256'] == hashlib.sha256(b'0123').hexdigest()
    [record] = (tmp_path / 'cache' / 'fingerprints').iterdir()  # the small file's hash is not kept
    held = store.read_json(record, 'sha256')
    store.write_json(record, 'sha256', {**held, 'sha256': 'kept'})  # what a later process finds there
    monkeypatch.setattr(store, '_HASHED', {})  # as in a new process
    assert store.fingerprint(big)['sha256'] == 'kept'  # read back, not hashed again
    replaced = tmp_path / 'new'
    replaced.write_bytes(b'9876543210')  # the same size, another inode
    os.replace(replaced, big)
    monkeypatch.setattr(store, '_HASHED', {})
    assert store.fingerprint(big)['sha256'] == hashlib.sha256(b'9876543210').hexdigest()
    assert store.read_json(record, 'sha256')['sha256'] == hashlib.sha256(b'9876543210').hexdigest()
    record.write_bytes(b'rdime-record sha256 2 00\n{}')  # damaged: hashed again, no error
    monkeypatch.setattr(store, '_HASHED', {})
    assert store.fingerprint(big)['sha256'] == hashlib.sha256(b'9876543210').hexdigest()


def test_a_slice_of_a_memory_map_reads_its_own_rows(tmp_path):
    rows = np.arange(40, dtype=np.float32).reshape(10, 4)
    rows.tofile(tmp_path / 'vecs.f4')
    mapped = np.memmap(tmp_path / 'vecs.f4', dtype=np.float32, mode='r', shape=(10, 4))
    part = mapped[3:]  # keeps its parent's file offset: read from the file, it would give rows 0-6
    assert store.whole_map(mapped) and not store.whole_map(part)
    for vecs, expected in ((mapped, rows), (part, rows[3:])):
        with store.row_reader(vecs) as read:
            np.testing.assert_array_equal(read(1, 4), expected[1:4])
        np.testing.assert_array_equal(store.random_rows(vecs)[[0, 5]], expected[[0, 5]])
