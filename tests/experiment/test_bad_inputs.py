"""The bad-input table of the runner, the command line, the collection files and the caches: each input with the
error or behaviour it must give. Command-line errors are one line naming the option and the fix, exit 2, before any
model loads; only a bug shows a traceback (exit 70). (The library stages' table is in test_bad_inputs_stages.py;
the collection files' line-by-line table in test_collection.py.)"""
import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pandas as pd
import pytest
from conftest import START_UP

from pyterrier_rdime.experiment import grid, runner
from pyterrier_rdime.experiment.cli import main
from pyterrier_rdime.experiment.collection import load_collection, read_fingerprint
from pyterrier_rdime.experiment.encoders import load_encoder
from pyterrier_rdime.experiment.indexes import bm25, dense_index, dense_index_path

TEXTS = ['dense retrieval with neural encoders', 'pruning embedding dimensions at query time',
         'bm25 is a lexical ranking function', 'the cat sat on the mat', 'query expansion with feedback',
         'statistics of risk estimation', 'hard thresholding of noisy signals']


def _collection(folder, texts=TEXTS, judged=4, run=None):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / 'docs.jsonl').write_text(''.join(json.dumps({'docno': f'd{i}', 'text': t}) + '\n'
                                               for i, t in enumerate(texts)))
    (folder / 'queries.tsv').write_text('1\tdense retrieval\n2\tnoisy signal thresholding\n')
    (folder / 'qrels').write_text(''.join(f'{q} 0 d{i} {int(i % 2 == 0)}\n' for q in (1, 2) for i in range(judged)))
    if run is not None:
        (folder / 'first.run').write_text(run)
    return folder


@pytest.fixture(scope='module')
def model():
    return load_encoder('minilm')


@pytest.fixture
def no_model(monkeypatch):
    """Every case of the command-line table fails before a model loads."""
    def loaded(*args, **kwargs):
        raise AssertionError('a model was loaded before the options were checked')
    monkeypatch.setattr(runner, 'load_encoder', loaded)


def _main(capsys, argv):
    status = main(argv)
    err = capsys.readouterr().err
    return status, err


@pytest.mark.parametrize('options, message', [
    (['--batch-size', '0'], 'rdime-experiment: error: --batch-size must be an integer >= 1, got 0; the number of '
                            'texts encoded at once'),
    (['--batch-size', '-1'], '--batch-size must be an integer >= 1, got -1'),
    (['--rel', '0'], '--rel must be an integer >= 1, got 0; the lowest label that counts as relevant'),
    (['--rel', '-1'], '--rel must be an integer >= 1, got -1'),
    (['--answers', 'missing.tsv'], '--answers missing.tsv: no such file'),
    (['--llm-generator', '{tmp}/no/such/model'], "--llm-generator '{tmp}/no/such/model': no such folder or file, "
                                                 'nor a Hugging Face model name'),
    (['--llm-generator', '{tmp}/notes.txt'], '--llm-generator {tmp}/notes.txt: a file but not a .gguf model'),
    (['--llm-generator', 'someone/not-downloaded'], "--llm-generator 'someone/not-downloaded': no such folder or "
                                                    'file and, as a Hugging Face model name, not in the local cache'),
    (['--index', '{tmp}/no/such/index'], "--index '{tmp}/no/such/index' is neither an existing folder nor a Hugging "
                                         'Face repository id'),
    (['--index', '{tmp}/empty'], '--index {tmp}/empty: not a complete pyterrier-dr FlexIndex: {tmp}/empty holds '
                                 'none of its files (vecs.f4, docnos.npids, pt_meta.json)'),
    (['--index', '{tmp}/half.flex'], "--index {tmp}/half.flex: not a complete pyterrier-dr FlexIndex: "
                                     '{tmp}/half.flex lacks docnos.npids, pt_meta.json (an indexing run stopped '
                                     "before the end); build it with (model >> FlexIndex(path).indexer("
                                     "mode='overwrite')).index(docs)"),
    (['--index', 'someone/some.flex'], "--index 'someone/some.flex': the Hugging Face hub cannot be reached"),
    (['--cache', '{tmp}/notes.txt/cache'], '--cache {tmp}/notes.txt/cache: cannot write there'),
    (['--out', '{tmp}/notes.txt'], '--out {tmp}/notes.txt: exists and is not a folder'),
    (['--workers', '0'], '--workers must be an integer >= 1, got 0'),
    (['--workers', str(4 * (os.cpu_count() or 1) + 1)],
     f'--workers {4 * (os.cpu_count() or 1) + 1} is more than 4 x the {os.cpu_count() or 1} CPU cores '
     f'({4 * (os.cpu_count() or 1)}); pass --workers {4 * (os.cpu_count() or 1)} or fewer'),
    (['--mode', 'retrieve', '--feedback', 'first-stage'], '--feedback first-stage applies to --mode rerank; --mode '
                                                          'retrieve has no first stage'),
    (['--ray-address', 'auto'], "--ray-address spreads --workers, the shards of --retriever sharded, or a grid's "
                                '--cells over the cluster; pass --workers 2 or more, --retriever sharded, or --cells '
                                '2 or more'),
    (['--cells', '0'], "--cells must be an integer >= 1, got 0; the grid's cells run at once on a Ray cluster"),
    (['--mode', 'retrieve', '--retriever', 'sharded', '--ray-address', '127.0.0.1:1'],
     "--ray-address: no Ray cluster answers at '127.0.0.1:1'"),
    (['--first-stage', '{tmp}/no.run'], "--first-stage '{tmp}/no.run' is not 'auto', 'bm25' or an existing TREC run"),
    (['--retriever', 'annoy', '--mode', 'retrieve'], "--retriever must be one of 'numpy'"),
    (['--depth', '0'], '--depth must be an integer >= 1, got 0'),
    (['--ks', '0.5,x'], '--ks'),
    (['--encoder', '{tmp}/empty'], "--encoder '{tmp}/empty': {tmp}/empty holds no model files"),
    (['--encoder', ','], "--encoder ',' names no encoder"),
    (['--measures', 'nDCG@0'], '--measures: nDCG@0 has cutoff 0; it must be an integer >= 1'),
    (['--measures', 'AP,AP(rel=0)'], '--measures: AP(rel=0) has rel 0; it must be an integer >= 1'),
    (['--measures', ','], '--measures: no measure given'),
    (['--first-stage', '{tmp}/notes.txt'], '{tmp}/notes.txt:1: 3 fields in'),
    (['--llm-generator', '{tmp}/empty'], '--llm-generator {tmp}/empty: a folder without config.json'),
    (['--encoder', 'someone/not-downloaded'], "--encoder 'someone/not-downloaded' (someone/not-downloaded) is not a "
                                              'local folder, not in the Hugging Face cache'),
])
def test_a_bad_option_is_one_line_before_any_model_loads(tmp_path, capsys, no_model, monkeypatch, options,
                                                         message):
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    (tmp_path / 'notes.txt').write_text('not a model\n')
    (tmp_path / 'empty').mkdir()
    (tmp_path / 'half.flex').mkdir()  # what an indexing run stopped while encoding leaves
    (tmp_path / 'half.flex' / 'vecs.f4').write_bytes(bytes(12))
    folder = _collection(tmp_path / 'coll')
    options = [o.replace('{tmp}', str(tmp_path)) for o in options]
    status, err = _main(capsys, [str(folder), '--cache', str(tmp_path / 'c'), '--out', str(tmp_path / 'o')]
                        + options + ['--quiet'])
    assert status == 2, err
    assert message.replace('{tmp}', str(tmp_path)) in err
    assert err.count('\n') == 1 and err.startswith('rdime-experiment: error: ') and 'Traceback' not in err
    assert 'error: rdime-experiment:' not in err


@pytest.mark.parametrize('options', [['--depth', '0'], ['--mode', 'retrieve', '--feedback', 'first-stage']])
def test_a_bad_protocol_option_creates_no_folder(tmp_path, capsys, no_model, options):
    status, err = _main(capsys, [str(_collection(tmp_path / 'coll')), '--cache', str(tmp_path / 'c'), '--out',
                                 str(tmp_path / 'o'), '--quiet'] + options)
    assert status == 2 and options[-2] in err, err
    assert not (tmp_path / 'o').exists() and not (tmp_path / 'c').exists()


@pytest.mark.parametrize('files, message', [
    ({'first.run': '1 Q0 d1 1 2.0 bm25\n1 Q0 d99 2 1.0 bm25\n'}, "first.run: docno 'd99' (qid '1') is not in"),
    ({'docs.jsonl': '{"docno": "d0", "text": "a"}\n{"docno": "d0", "text": "b"}\n'},
     "docs.jsonl:2: docno 'd0' is also on line 1"),
    ({'qrels': '1 0 d0 yes\n'}, "qrels:1: label 'yes' of qid '1', docno 'd0' is not an integer"),
    ({'queries.tsv': '1 dense retrieval\n'}, "queries.tsv:1: no tab in '1 dense retrieval'"),
    ({'llm_answers.tsv': '1\n'}, 'llm_answers.tsv:1:'),
])
def test_a_bad_collection_file_is_one_line_before_any_model_loads(tmp_path, capsys, no_model, files, message):
    folder = _collection(tmp_path / 'coll')
    for name, text in files.items():
        (folder / name).write_text(text)
    status, err = _main(capsys, [str(folder), '--cache', str(tmp_path / 'c'), '--out', str(tmp_path / 'o'),
                                 '--quiet'])
    assert status == 2 and message in err and err.count('\n') == 1, err


def test_a_run_file_naming_an_unknown_docno_fails_before_encoding(tmp_path, capsys, monkeypatch):
    folder = _collection(tmp_path / 'coll')
    (tmp_path / 'bad.run').write_text('1 Q0 d1 1 2.0 bm25\n1 Q0 d42 2 1.0 bm25\n2 Q0 d2 1 1.0 bm25\n')
    status, err = _main(capsys, [str(folder), '--first-stage', str(tmp_path / 'bad.run'), '--cache',
                                 str(tmp_path / 'c'), '--out', str(tmp_path / 'o'), '--quiet'])
    assert status == 2, err
    assert f"the first-stage run {tmp_path / 'bad.run'} names docno 'd42', which is not in the corpus of collection " \
           f"'{folder}'" in err
    assert not list((tmp_path / 'c').rglob('*.flex*'))  # nothing encoded, no partial index left


@pytest.mark.parametrize('error, status, shown', [
    (TypeError('unsupported operand'), 70, ['Traceback', 'TypeError: unsupported operand',
                                            'internal error: this is a bug in pyterrier-rdime']),
    (PermissionError(13, 'Permission denied', '/x/cache'), 2,
     ["error: [Errno 13] Permission denied: '/x/cache'; check that path, its permissions and the free space"]),
    (MemoryError(), 2, ['error: out of memory; lower --batch-size or --workers']),
    (KeyboardInterrupt(), 130, ['error: interrupted; every cache holds only what was complete']),
    (ImportError("the FAISS retrievers need faiss: pip install faiss-cpu"), 2, ['need faiss: pip install faiss-cpu']),
    # what ir_datasets raises for irds:vaswani when IR_DATASETS_HOME holds no copy of its files and there is no network
    (RuntimeError('All download sources failed', [('RequestsDownload(...)', 'ConnectionError(...)')]), 2,
     ['error: the ir_datasets collection cannot be downloaded here (every download source failed); point '
      'IR_DATASETS_HOME (now ', ') at a folder holding its files, or pass a local collection folder\n']),
])
def test_only_a_bug_shows_a_traceback(tmp_path, capsys, monkeypatch, error, status, shown):
    def failing(*args, **kwargs):
        raise error
    monkeypatch.setattr(grid, 'run_experiment', failing)  # what the command runs for each cell
    got, err = _main(capsys, [str(_collection(tmp_path / 'coll')), '--cache', str(tmp_path / 'c'), '--out',
                              str(tmp_path / 'o'), '--quiet'])
    assert got == status, err
    for fragment in shown:
        assert fragment in err
    assert ('Traceback' in err) == (status == 70)
    assert status == 70 or err.count('\n') == 1


def test_a_value_error_inside_another_library_is_a_bug_not_the_users(tmp_path, capsys, monkeypatch):
    def failing(*args, **kwargs):
        pd.DataFrame({'a': [1, 2]}).set_axis(['x', 'y', 'z'], axis=0)  # pandas' own ValueError: a bug of ours
    monkeypatch.setattr(grid, 'run_experiment', failing)  # what the command runs for each cell
    status, err = _main(capsys, [str(_collection(tmp_path / 'coll')), '--cache', str(tmp_path / 'c'), '--out',
                                 str(tmp_path / 'o'), '--quiet'])
    assert status == 70 and 'Traceback' in err and 'this is a bug' in err


def test_help_works_without_the_runner_packages_and_the_install_lines_are_shown(tmp_path):
    """The runner's packages hidden from a fresh interpreter: --help still prints; a run names the install lines."""
    script = textwrap.dedent('''
        import importlib.abc, importlib.util, sys
        HIDDEN = {'pyterrier_dr', 'pyterrier_pisa', 'ir_datasets', 'sentence_transformers', 'statsmodels', 'scipy',
                  'matplotlib', 'tabulate', 'torch', 'transformers'}
        class Hide(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.split('.')[0] in HIDDEN:
                    raise ModuleNotFoundError(name)
        sys.meta_path.insert(0, Hide())
        find_spec = importlib.util.find_spec
        importlib.util.find_spec = lambda name, *a: None if name.split('.')[0] in HIDDEN else find_spec(name, *a)
        from pyterrier_rdime.experiment.cli import main
        sys.exit(main(sys.argv[1:]))
    ''')
    helped = subprocess.run([sys.executable, '-c', script, '--help'], capture_output=True, text=True, cwd=tmp_path)
    assert helped.returncode == 0 and 'usage: rdime-experiment' in helped.stdout, helped.stderr
    ran = subprocess.run([sys.executable, '-c', script, 'irds:vaswani'], capture_output=True, text=True, cwd=tmp_path)
    assert ran.returncode == 2
    assert ran.stderr.endswith("pip install torch --index-url https://download.pytorch.org/whl/cpu  # or the torch "
                               "build for your machine, first\npip install '.[experiment]'  # in a clone of "
                               "https://github.com/pyterrier-rdime/pyterrier-rdime, or:\npip install "
                               '"pyterrier-rdime[experiment] @ git+https://github.com/pyterrier-rdime/pyterrier-rdime"\n')


def test_the_install_lines_name_the_repository_of_setup_cfg():
    """Until the package is published, pip installs it from a clone or from setup.cfg's url."""
    from configparser import ConfigParser
    from pathlib import Path

    from pyterrier_rdime.experiment.cli import REPO
    setup = ConfigParser()
    setup.read(Path(__file__).resolve().parents[2] / 'setup.cfg')
    assert REPO == setup['metadata']['url']


def test_the_library_rejects_a_measure_with_cutoff_or_level_below_one(tmp_path, no_model):
    """run_experiment itself (not only the command line): trec_eval aborts the process on nDCG@0."""
    folder = _collection(tmp_path / 'coll')
    for measures, message in ((['nDCG@0'], '--measures: nDCG@0 has cutoff 0'),
                              (['AP', 'AP(rel=0)'], '--measures: AP(rel=0) has rel 0')):
        with pytest.raises(ValueError, match=message.replace('(', r'\(').replace(')', r'\)')):
            runner.run_experiment(str(folder), measures=measures, cache_dir=tmp_path / 'c', verbose=False)


def test_a_stale_index_is_never_used_the_issue_scenario(tmp_path, model):
    """Index the whole corpus (retrieve mode's cache); append a judged document and index again: full retrieval over
    it finds the new document and gives the ranking of a from-scratch index. A ranking that names the new document
    gets its own vector, never another's."""
    folder = _collection(tmp_path / 'coll')
    dense_index(load_collection(folder), model, 'minilm', tmp_path / 'cache', None, verbose=False)
    added = 'noisy signal thresholding, hard thresholding of noise'
    with open(folder / 'docs.jsonl', 'a') as f:
        f.write(json.dumps({'docno': 'd7', 'text': added}) + '\n')
    with open(folder / 'qrels', 'a') as f:
        f.write('2 0 d7 1\n')
    collection = load_collection(folder)
    index = dense_index(collection, model, 'minilm', tmp_path / 'cache', None, verbose=False)
    scratch = dense_index(collection, model, 'minilm', tmp_path / 'scratch', None, verbose=False)
    queries = model.query_encoder()(collection.topics)
    got, expected = (i.np_retriever(num_results=8)(queries) for i in (index, scratch))
    pd.testing.assert_frame_equal(got[['qid', 'docno', 'rank']], expected[['qid', 'docno', 'rank']])
    np.testing.assert_allclose(got['score'], expected['score'], atol=1e-6)
    assert got.loc[got['qid'] == '2', 'docno'].iloc[0] == 'd7'
    assert read_fingerprint(index.index_path)['complete']
    loaded = index.vec_loader()(pd.DataFrame({'qid': ['2'], 'docno': ['d7']}))
    np.testing.assert_allclose(loaded['doc_vec'][0], model.encode_docs([added])[0], atol=1e-6)


#: A stand-in encoder for the fault tests (they are about the cache, not the model): a fixed vector per text, so
#: that a child process starts in seconds and gives the parent's vectors.
_HASH_ENCODER = textwrap.dedent('''
    import numpy as np
    from pyterrier_rdime.experiment.indexes import text_hash

    class HashEncoder:
        def __init__(self, on_batch=lambda texts: None):
            self.on_batch = on_batch

        def encode_docs(self, texts, batch_size=None):
            self.on_batch(texts)
            return np.stack([np.random.default_rng(text_hash(t)).standard_normal(8).astype(np.float32)
                             for t in texts])
''')
exec(_HASH_ENCODER)

def _sigkill_once_started(script, args, started, stage):
    """Runs ``script`` in a child Python with ``args`` and the path ``started``, and kills it with SIGKILL as soon as
    it creates that file (at ``stage``, within ``START_UP`` s); returns the finished child."""
    child = subprocess.Popen([sys.executable, '-c', script, *map(str, args), str(started)])
    try:
        deadline = time.monotonic() + START_UP
        while not started.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert started.exists(), f'the child never reached {stage}'
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    return child


_KILLED_BUILD = _HASH_ENCODER + textwrap.dedent('''
    import sys, time
    from pathlib import Path
    from pyterrier_rdime.experiment.collection import load_collection
    from pyterrier_rdime.experiment.indexes import dense_index
    folder, cache, started = sys.argv[1:4]
    batches = []

    def stall(texts):
        batches.append(texts)
        if len(batches) == 2:  # killed while the second batch is encoded: the first one is written already
            Path(started).write_text('encoding')
            time.sleep(600)
    dense_index(load_collection(folder), HashEncoder(stall), 'minilm', cache, None, batch_size=2, verbose=False)
''')


@pytest.mark.parametrize('first', [None, ['d0', 'd1']], ids=['while-encoding', 'while-extending'])
def test_sigkill_while_building_the_index_leaves_the_cache_correct(tmp_path, first):
    """A process killed mid-encoding (on an empty cache, or extending an index) leaves no partial index: the cached
    one is as it was, and the next run gives the vectors of a from-scratch build."""
    folder = _collection(tmp_path / 'coll')
    cache = tmp_path / 'cache'
    path = dense_index_path(load_collection(folder), 'minilm', cache)
    model = HashEncoder()  # noqa: F821 (defined by exec above)
    if first is not None:
        dense_index(load_collection(folder), model, 'minilm', cache, first, verbose=False)
    before = sorted(os.listdir(path)) if first is not None else None
    child = _sigkill_once_started(_KILLED_BUILD, [folder, cache], tmp_path / 'started', 'its second batch')
    assert child.returncode == -signal.SIGKILL
    assert list(path.parent.glob('.*.tmp.flex'))  # what the killed process left...
    if first is None:
        assert not path.exists()
    else:
        assert sorted(os.listdir(path)) == before and len(dense_index(load_collection(folder), model, 'minilm',
                                                                      cache, first, verbose=False)) == 2
    index = dense_index(load_collection(folder), model, 'minilm', cache, None, verbose=False)
    assert not list(path.parent.glob('.*.tmp.flex'))  # ...the next builder removed
    scratch = dense_index(load_collection(folder), model, 'minilm', tmp_path / 'scratch', None, verbose=False)
    got = dict(zip(index.payload()[0].fwd[np.arange(7)], index.np_vecs()))
    expected = dict(zip(scratch.payload()[0].fwd[np.arange(7)], scratch.np_vecs()))
    assert sorted(got) == sorted(expected)
    for docno in expected:
        np.testing.assert_array_equal(got[docno], expected[docno])


def test_a_folder_that_sentence_transformers_refuses_is_one_line_naming_the_encoder(tmp_path, capsys):
    (tmp_path / 'model').mkdir()
    (tmp_path / 'model' / 'config.json').write_text('{"model_type": "no-such-architecture"}')
    with pytest.raises(ValueError, match=f"--encoder '{tmp_path / 'model'}': cannot load {tmp_path / 'model'} as a "
                                         'sentence-transformers model'):
        load_encoder(str(tmp_path / 'model'))
    with pytest.raises(ValueError, match='batch_size \\(--batch-size\\) must be an integer >= 1, got 0'):
        load_encoder('minilm', batch_size=0)


_KILLED_BM25 = textwrap.dedent('''
    import sys, time
    from pathlib import Path
    from pyterrier_rdime.experiment.collection import load_collection
    from pyterrier_rdime.experiment.indexes import bm25
    folder, cache, started = sys.argv[1:4]
    collection = load_collection(folder)
    read = collection.docs

    def stalled(docnos=None):
        for i, doc in enumerate(read(docnos)):
            if i == 3:  # killed while PISA indexes: three documents are in its files already
                Path(started).write_text('indexing')
                time.sleep(600)
            yield doc
    collection.docs = stalled
    bm25(collection, cache, 10)
''')


def test_sigkill_while_building_the_bm25_index_leaves_the_cache_correct(tmp_path):
    folder = _collection(tmp_path / 'coll')
    _sigkill_once_started(_KILLED_BM25, [folder, tmp_path / 'cache'], tmp_path / 'started', 'its fourth document')
    collection = load_collection(folder)
    assert not (tmp_path / 'cache' / collection.slug / 'pisa').exists()
    got = bm25(collection, tmp_path / 'cache', 10)(collection.topics)
    assert not list((tmp_path / 'cache' / collection.slug).glob('.pisa.*.tmp'))
    expected = bm25(collection, tmp_path / 'scratch', 10)(collection.topics)
    pd.testing.assert_frame_equal(got, expected)


def test_concurrent_builders_of_one_index_encode_each_document_once(tmp_path):
    """Two runs building the same cache entry at once: the second waits for the first, then reuses its index."""
    folder = _collection(tmp_path / 'coll')
    encoded = []
    model = HashEncoder(lambda texts: encoded.extend(texts) or time.sleep(0.2))  # noqa: F821 (exec above)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        indexes = list(pool.map(lambda _: dense_index(load_collection(folder), model, 'minilm', tmp_path / 'cache',
                                                      None, batch_size=2, verbose=False), range(2)))
    assert sorted(encoded) == sorted(TEXTS)
    assert [len(index) for index in indexes] == [7, 7]
