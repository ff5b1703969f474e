"""A collection is loaded, checked and fingerprinted once, and the steps of a run only read it: docs.jsonl is read
once (a few documents are read at their offsets), the run's docnos are checked once, and an option bounded by the
documents (--shards) fails before any work. Also: qrels of unknown queries are named once, and an interrupted
encoding is carried on by the next run. Tiny collections in tmp_path, the bundled MiniLM."""
import builtins
import io
import json
import logging
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from pruned_data import flex_index

import pyterrier_rdime
from pyterrier_rdime.experiment.cli import main
from pyterrier_rdime.experiment.collection import load_collection
from pyterrier_rdime.experiment.encoders import load_encoder
from pyterrier_rdime.experiment.indexes import dense_index
from pyterrier_rdime.experiment.runner import run_experiment

WORDS = ['dense', 'retrieval', 'pruning', 'query', 'vector', 'passage', 'ranking', 'noise', 'signal', 'risk']
SMALL_RUN = dict(dimes=['prf', 'oracle'], ks=[0.5], controls=[], sweep=False, depth=5, verbose=False)


def _folder(path: Path, num_docs: int = 300, run: bool = True, qrels_extra: str = '') -> Path:
    """A folder collection of ``num_docs`` passages of ~300 bytes, 2 queries, and a run of 8 candidates each."""
    rng = np.random.default_rng(0)
    path.mkdir(parents=True)
    with open(path / 'docs.jsonl', 'w') as f:
        for i in range(num_docs):
            f.write(json.dumps({'docno': f'doc-{i:x}', 'text': ' '.join(rng.choice(WORDS, 40))}) + '\n')
    (path / 'queries.tsv').write_text('1\tdense retrieval\n2\tnoise and signal\n')
    (path / 'qrels').write_text(''.join(f'{q} 0 doc-{i:x} {i % 3}\n' for q in (1, 2) for i in range(3, 9))
                                + qrels_extra)
    if run:
        (path / 'bm25.run').write_text(''.join(f'{q} Q0 doc-{i * 7 + 20:x} {i + 1} {10 - i} bm25\n'
                                               for q in (1, 2) for i in range(8)))
    return path


@pytest.fixture(scope='module')
def model():
    return load_encoder('minilm')


@pytest.fixture
def docs_reads(monkeypatch):
    """The bytes read from each opening of a docs.jsonl, from now on (the package opens it in binary)."""
    reads = []
    real_open = builtins.open

    class Counted(io.FileIO):
        def readinto(self, buffer):
            count = super().readinto(buffer)
            reads[-1] += count or 0
            return count

        def read(self, size=-1):
            data = super().read(size)
            reads[-1] += len(data or b'')
            return data

        def readall(self):
            data = super().readall()
            reads[-1] += len(data)
            return data

    def counted_open(file, mode='r', buffering=-1, *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and Path(file).name == 'docs.jsonl' and 'b' in mode:
            reads.append(0)
            raw = Counted(file, 'rb')
            return raw if buffering == 0 else io.BufferedReader(raw)
        return real_open(file, mode, buffering, *args, **kwargs)
    monkeypatch.setattr(builtins, 'open', counted_open)
    return reads


def test_a_rerank_run_reads_docs_jsonl_once(tmp_path, docs_reads):
    folder = _folder(tmp_path / 'coll')
    size = (folder / 'docs.jsonl').stat().st_size
    result = run_experiment(folder, cache_dir=tmp_path / 'cache', **SMALL_RUN)
    assert set(result.table['dime']) >= {'prf', 'oracle'}
    full_reads = [n for n in docs_reads if n >= size]
    assert len(full_reads) == 1, docs_reads  # loading it; the 10 candidates and 12 judged documents are seeks
    candidates = sum(docs_reads) - size
    assert 0 < candidates < size / 10, docs_reads


def test_a_retrieve_run_with_an_existing_index_reads_docs_jsonl_once(tmp_path, docs_reads):
    folder = _folder(tmp_path / 'coll', run=False)
    vectors = np.random.default_rng(1).standard_normal((300, 384)).astype(np.float32)
    flex_index(tmp_path / 'index.flex', vectors, [f'doc-{i:x}' for i in range(300)])
    run_experiment(folder, mode='retrieve', index=str(tmp_path / 'index.flex'), num_results=20,
                   cache_dir=tmp_path / 'cache', **{**SMALL_RUN, 'depth': 100})
    assert docs_reads == [(folder / 'docs.jsonl').stat().st_size]


def test_the_runs_docnos_are_checked_once_when_the_collection_loads(tmp_path):
    collection = load_collection(_folder(tmp_path / 'coll'))
    run_docnos = set(collection.run['docno'])
    asked = []
    absent = collection.absent
    collection.absent = lambda docnos: asked.append(set(docnos) & run_docnos) or absent(docnos)
    run_experiment(collection, cache_dir=tmp_path / 'cache', **SMALL_RUN)
    assert not any(asked), asked  # the judged documents are looked up, the run's candidates are not


def _stays(collection, **settings):
    """Follows ``collection`` call by call through run_experiment: the package modules that calls receiving it run
    in, consecutive calls in one module counted once (a stay)."""
    package = str(Path(pyterrier_rdime.__file__).parent)
    modules = []

    def profile(frame, event, arg):
        if event != 'call' or not frame.f_code.co_filename.startswith(package):
            return
        if frame.f_code.co_flags & 0x20 and frame.f_lasti > 0:  # a generator resumed, not a new call
            return
        if any(value is collection for value in frame.f_locals.values()):
            module = os.path.relpath(frame.f_code.co_filename, package)
            if not modules or modules[-1] != module:
                modules.append(module)
    sys.setprofile(profile)
    try:
        run_experiment(collection, **settings)
    finally:
        sys.setprofile(None)
    return modules


def test_the_steps_only_read_the_collection(tmp_path):
    collection = load_collection(_folder(tmp_path / 'coll'))
    stays = _stays(collection, cache_dir=tmp_path / 'cache', first_stage='bm25', **SMALL_RUN)
    # loaded, checked and keyed once: no step calls back into collection.py with it (main: 4 times, 7 returns)
    assert 'experiment/collection.py' not in stays, ' > '.join(stays)
    assert len(stays) - len(set(stays)) <= 8, ' > '.join(stays)


def test_more_shards_than_documents_fail_before_any_work(tmp_path, monkeypatch, capsys):
    folder = _folder(tmp_path / 'coll', num_docs=30, run=False)
    monkeypatch.setattr('pyterrier_rdime.experiment.runner.load_encoder',
                        lambda *a, **k: pytest.fail('the encoder was loaded'))
    with pytest.raises(ValueError, match=r"--shards 31 is more than the 30 documents of collection '.*coll'"):
        run_experiment(folder, mode='retrieve', retriever='sharded', shards=31, cache_dir=tmp_path / 'cache',
                       verbose=False)
    status = main([str(folder), '--mode', 'retrieve', '--retriever', 'sharded', '--shards', '1000', '--quiet',
                   '--cache', str(tmp_path / 'cache'), '--out', str(tmp_path / 'out')])
    err = capsys.readouterr().err
    assert status == 2 and '--shards 1000 is more than the 30 documents' in err and 'pass --shards 30' in err, err
    assert not list((tmp_path / 'cache').rglob('*.flex'))
    # in a grid, a collection too small for --shards fails before the first cell (a large one) starts
    big = _folder(tmp_path / 'big', num_docs=60, run=False)
    status = main([str(big), str(folder), '--mode', 'retrieve', '--retriever', 'sharded', '--shards', '40',
                   '--quiet', '--cache', str(tmp_path / 'cache'), '--out', str(tmp_path / 'grid')])
    err = capsys.readouterr().err
    assert status == 2 and '--shards 40 is more than the 30 documents' in err, err
    assert not list((tmp_path / 'cache').rglob('*.flex')) and not list((tmp_path / 'grid').rglob('cell.json'))


def test_qrels_of_queries_the_collection_lacks_are_counted_once(tmp_path, caplog):
    folder = _folder(tmp_path / 'coll', qrels_extra='7 0 doc-1 1\n7 0 doc-2 0\n8 0 doc-1 1\n')
    with caplog.at_level(logging.WARNING, logger='pyterrier_rdime'):
        collection = load_collection(folder)
    warned = [r.getMessage() for r in caplog.records if 'qrels judge' in r.getMessage()]
    assert warned == [f"collection {folder}: the qrels judge 2 queries that are not among its 2 queries (e.g. qid "
                      "'7'); their 3 judgments are left out"]
    assert sorted(collection.topics['qid']) == ['1', '2']


def test_an_interrupted_encoding_is_carried_on_by_the_next_run(tmp_path, model, monkeypatch):
    collection = load_collection(_folder(tmp_path / 'coll', num_docs=40, run=False))
    encode = model.encode_docs
    encoded = []

    def interrupted(texts, batch_size=None):
        if len(encoded) >= 24:
            raise KeyboardInterrupt
        encoded.extend(texts)
        return encode(texts)
    monkeypatch.setattr(model, 'encode_docs', interrupted)
    with pytest.raises(KeyboardInterrupt):
        dense_index(collection, model, 'minilm', tmp_path / 'cache', None, batch_size=8, verbose=False)
    assert len(encoded) == 24
    encoded.clear()
    monkeypatch.setattr(model, 'encode_docs', lambda texts, batch_size=None: encoded.extend(texts) or encode(texts))
    index = dense_index(collection, model, 'minilm', tmp_path / 'cache', None, batch_size=8, verbose=False)
    assert len(encoded) == 16  # the 24 documents encoded before the interruption are read back
    docnos, vecs, _ = index.payload()
    texts = {doc['docno']: doc['text'] for doc in collection.docs(None)}
    order = [docnos.fwd[i] for i in range(len(index))]
    np.testing.assert_allclose(np.asarray(vecs), encode([texts[d] for d in order]), atol=1e-5)
    assert not list((tmp_path / 'cache').rglob('*encoded-so-far*'))  # kept only until the index is complete


def test_a_first_stage_run_file_is_parsed_once(tmp_path, monkeypatch, capsys):
    from pyterrier_rdime.experiment import collection as collection_module
    folder = _folder(tmp_path / 'coll', run=False)
    run = tmp_path / 'first.run'
    run.write_text(''.join(f'{q} Q0 doc-{i * 7 + 20:x} {i + 1} {10 - i} bm25\n' for q in (1, 2) for i in range(8)))
    read = collection_module.utf8_lines
    parsed = []
    monkeypatch.setattr(collection_module, 'utf8_lines', lambda path, *a: parsed.append(Path(path)) or read(path, *a))
    status = main([str(folder), '--first-stage', str(run), '--dimes', 'prf', '--ks', '0.5', '--controls', '',
                   '--no-sweep', '--depth', '5', '--quiet', '--cache', str(tmp_path / 'c'),
                   '--out', str(tmp_path / 'o')])
    assert status == 0, capsys.readouterr().err
    assert parsed.count(run) == 1  # checking the command's options, then the cell: one parse
