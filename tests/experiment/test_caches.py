"""The runner's caches are keyed by content and checked on use: a changed corpus re-encodes only what changed and gives
the vectors of a from-scratch build; another encoder's files, or a cache without a record, are encoded again; a copied
cache (another folder, machine or virtual environment) is reused. Tiny collections in tmp_path, the bundled MiniLM."""
import json
import logging
import shutil

import numpy as np
import pytest

from pyterrier_rdime.experiment import encoders
from pyterrier_rdime.experiment.collection import FINGERPRINT, load_collection, read_fingerprint
from pyterrier_rdime.experiment.encoders import encoder_fingerprint, load_encoder
from pyterrier_rdime.experiment.indexes import (
    TEXT_HASHES,
    adopt_index,
    bm25,
    dense_index,
    dense_index_path,
    encoder_slug,
    text_hashes,
)

TEXTS = ['dense retrieval with neural encoders', 'pruning embedding dimensions at query time',
         'bm25 is a lexical ranking function', 'the cat sat on the mat', 'query expansion with feedback']


@pytest.fixture(scope='module')
def model():
    return load_encoder('minilm')


@pytest.fixture
def encoded(model, monkeypatch):
    """The texts the model encodes from now on."""
    texts = []
    original = model.encode_docs
    monkeypatch.setattr(model, 'encode_docs', lambda batch, batch_size=None: texts.extend(batch) or original(batch))
    return texts


def _write(folder, docs):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / 'docs.jsonl').write_text(''.join(json.dumps({'docno': d, 'text': t}) + '\n' for d, t in docs.items()))
    (folder / 'queries.tsv').write_text('q1\tdense retrieval\n')
    (folder / 'qrels').write_text('q1 0 d0 1\n')
    return folder


def _vectors(index):
    docnos, vecs, _ = index.payload()
    return {str(docnos.fwd[i]): np.array(vecs[i]) for i in range(len(index))}


def _from_scratch(tmp_path, folder, model, docnos=None):
    return _vectors(dense_index(load_collection(folder), model, 'minilm', tmp_path / 'scratch', docnos, verbose=False))


def _assert_same_vectors(got, expected):
    assert list(got) == list(expected)
    for docno in expected:
        np.testing.assert_allclose(got[docno], expected[docno], atol=1e-6, err_msg=docno)


@pytest.mark.parametrize('edit, re_encoded, counts', [
    (lambda docs: docs.update(d5='a new document about caches'), ['a new document about caches'],
     '0 of its 5 documents changed, 0 removed, 1 added'),
    (lambda docs: docs.update(d1='pruning the dimensions of the query'), ['pruning the dimensions of the query'],
     '1 of its 5 documents changed, 0 removed, 0 added'),
    (lambda docs: docs.pop('d2'), [], '0 of its 5 documents changed, 1 removed, 0 added'),
])
def test_a_changed_corpus_gives_the_vectors_of_a_from_scratch_build(tmp_path, model, encoded, edit, re_encoded,
                                                                   counts, caplog):
    docs = {f'd{i}': t for i, t in enumerate(TEXTS)}
    folder = _write(tmp_path / 'coll', docs)
    cache = tmp_path / 'cache'
    dense_index(load_collection(folder), model, 'minilm', cache, None, verbose=False)
    encoded.clear()
    edit(docs)
    _write(folder, docs)
    with caplog.at_level(logging.WARNING, logger='pyterrier_rdime'):
        index = dense_index(load_collection(folder), model, 'minilm', cache, None, verbose=False)
    assert encoded == re_encoded
    warnings = [r.getMessage() for r in caplog.records if 'changed since this index was built' in r.message]
    assert len(warnings) == 1 and f'({counts}); keeping' in warnings[0]
    assert read_fingerprint(index.index_path)['complete']
    expected = _from_scratch(tmp_path, folder, model)
    _assert_same_vectors(dict(sorted(_vectors(index).items())), dict(sorted(expected.items())))


def test_a_partial_index_re_encodes_a_changed_document_it_needs(tmp_path, model, encoded, caplog):
    docs = {f'd{i}': t for i, t in enumerate(TEXTS)}
    folder = _write(tmp_path / 'coll', docs)
    cache = tmp_path / 'cache'
    dense_index(load_collection(folder), model, 'minilm', cache, ['d0', 'd1', 'd2'], verbose=False)
    docs['d1'] = 'an edited passage'
    docs['d2'] = 'another edited passage, not needed now'
    _write(folder, docs)
    encoded.clear()
    with caplog.at_level(logging.WARNING, logger='pyterrier_rdime'):
        index = dense_index(load_collection(folder), model, 'minilm', cache, ['d1', 'd0', 'd3'], verbose=False)
    assert [r.getMessage() for r in caplog.records if 'changed since' in r.message][0].endswith(
        '(2 of its 3 documents changed, 0 removed; the corpus holds 2 other documents that this partial index does '
        'not); keeping the 1 other vectors')
    assert sorted(encoded) == ['an edited passage', 'the cat sat on the mat']
    got = _vectors(index)
    assert sorted(got) == ['d0', 'd1', 'd3']  # d2's stale vector is gone, not kept for a later run
    expected = _from_scratch(tmp_path, folder, model, ['d0', 'd1', 'd3'])
    _assert_same_vectors(dict(sorted(got.items())), dict(sorted(expected.items())))
    encoded.clear()
    dense_index(load_collection(folder), model, 'minilm', cache, ['d3', 'd1'], verbose=False)
    assert encoded == []


def test_an_unknown_docno_fails_before_encoding_naming_it_and_the_collection(tmp_path, model, encoded):
    folder = _write(tmp_path / 'coll', {'d0': TEXTS[0], 'd1': TEXTS[1]})
    collection = load_collection(folder)
    with pytest.raises(ValueError, match=rf"docno 'd9' \(and 1 more\), which is not in the corpus of collection "
                                         rf"'{folder}'"):
        dense_index(collection, model, 'minilm', tmp_path / 'cache', ['d0', 'd9', 'd1', 'x'], verbose=False)
    assert encoded == []
    assert not list((tmp_path / 'cache').rglob('*.flex'))


def test_a_copied_cache_is_reused_in_another_folder_and_environment(tmp_path, model, encoded, monkeypatch):
    folder = _write(tmp_path / 'here' / 'coll', {f'd{i}': t for i, t in enumerate(TEXTS)})
    built = dense_index(load_collection(folder), model, 'minilm', tmp_path / 'here' / 'cache', None, verbose=False)
    vectors = _vectors(built)
    shutil.copytree(tmp_path / 'here', tmp_path / 'there')
    # another virtual environment: the bundled model's files at another path
    copy = tmp_path / 'venv2' / 'model'
    shutil.copytree(encoders.bundled_minilm_path(), copy)
    (copy / 'README.md').write_text('documentation changes no vector')
    monkeypatch.setattr(encoders, 'bundled_minilm_path', lambda: copy)
    encoded.clear()
    index = dense_index(load_collection(tmp_path / 'there' / 'coll'), model, 'minilm', tmp_path / 'there' / 'cache',
                        None, verbose=False)
    assert encoded == []
    assert index.index_path.is_relative_to(tmp_path / 'there')
    _assert_same_vectors(_vectors(index), vectors)


def test_other_encoder_files_are_encoded_again(tmp_path, model, encoded, monkeypatch):
    folder = _write(tmp_path / 'coll', {'d0': TEXTS[0], 'd1': TEXTS[1]})
    before = encoder_fingerprint('minilm')
    path = dense_index(load_collection(folder), model, 'minilm', tmp_path / 'cache', None, verbose=False).index_path
    copy = tmp_path / 'tuned'
    shutil.copytree(encoders.bundled_minilm_path(), copy)
    config = json.loads((copy / 'config.json').read_text())
    (copy / 'config.json').write_text(json.dumps({**config, 'note': 'fine-tuned'}))
    monkeypatch.setattr(encoders, 'bundled_minilm_path', lambda: copy)
    assert encoder_fingerprint('minilm') != before
    assert dense_index_path(load_collection(folder), 'minilm', tmp_path / 'cache') != path
    # the same folder name, copied by hand, is still refused by its record
    shutil.copytree(path, dense_index_path(load_collection(folder), 'minilm', tmp_path / 'cache'))
    encoded.clear()
    dense_index(load_collection(folder), model, 'minilm', tmp_path / 'cache', None, verbose=False)
    assert encoded == TEXTS[:2]


def test_a_cache_without_a_record_is_encoded_again_unless_adopted(tmp_path, model, encoded, caplog):
    import pyterrier_dr
    folder = _write(tmp_path / 'coll', {f'd{i}': t for i, t in enumerate(TEXTS)})
    collection = load_collection(folder)
    old = tmp_path / 'old.flex'
    (model >> pyterrier_dr.FlexIndex(str(old), verbose=False).indexer()).index(collection.docs(None))
    path = dense_index_path(collection, 'minilm', tmp_path / 'cache')
    shutil.copytree(old, path)
    encoded.clear()
    with caplog.at_level(logging.WARNING, logger='pyterrier_rdime'):
        dense_index(collection, model, 'minilm', tmp_path / 'cache', ['d0', 'd1'], verbose=False)
    assert encoded == TEXTS[:2] and 'no record of what this cached index was built from' in caplog.text
    shutil.rmtree(path)
    assert adopt_index(old, collection, 'minilm', tmp_path / 'cache') == path
    assert not old.exists() and (path / FINGERPRINT).is_file() and (path / TEXT_HASHES).is_file()
    encoded.clear()
    index = dense_index(collection, model, 'minilm', tmp_path / 'cache', None, verbose=False)
    assert encoded == [] and len(index) == 5 and read_fingerprint(path)['complete']


def test_the_progress_bar_counts_only_the_documents_to_encode(tmp_path, model, monkeypatch):
    import pyterrier as pt
    folder = _write(tmp_path / 'coll', {f'd{i}': t for i, t in enumerate(TEXTS)})
    dense_index(load_collection(folder), model, 'minilm', tmp_path / 'cache', ['d0', 'd1', 'd2'], verbose=False)
    bars = []
    original = pt.tqdm

    def recorded(*args, **kwargs):
        bars.append(original(*args, **kwargs))
        return bars[-1]
    monkeypatch.setattr(pt, 'tqdm', recorded)
    dense_index(load_collection(folder), model, 'minilm', tmp_path / 'cache', None, verbose=True)
    assert [(bar.n, bar.total) for bar in bars] == [(2, 2)]


def test_the_bm25_index_is_built_again_for_changed_documents(tmp_path, caplog):
    docs = {f'd{i}': t for i, t in enumerate(TEXTS)}
    folder = _write(tmp_path / 'coll', docs)
    collection = load_collection(folder)
    before = bm25(collection, tmp_path / 'cache', 10)(collection.topics)
    assert before['docno'].tolist() == ['d0']
    assert read_fingerprint(tmp_path / 'cache' / collection.slug / 'pisa')['docs'] == collection.fingerprint
    docs['d5'] = 'dense retrieval, dense retrieval and more dense retrieval'
    _write(folder, docs)
    collection = load_collection(folder)
    with caplog.at_level(logging.WARNING, logger='pyterrier_rdime'):
        after = bm25(collection, tmp_path / 'cache', 10)(collection.topics)
    assert 'built from other documents than those of' in caplog.text
    scratch = bm25(collection, tmp_path / 'scratch', 10)(collection.topics)
    assert after['docno'].tolist() == scratch['docno'].tolist() == ['d5', 'd0']
    np.testing.assert_allclose(after['score'], scratch['score'])
    assert sorted(p.name for p in (tmp_path / 'cache' / collection.slug).iterdir()) == ['.pisa.lock', 'pisa']


def test_an_index_of_one_needed_document_holds_a_second_one(tmp_path, model, encoded):
    """pyterrier-dr's docno lookup cannot read a one-document index (--depth 1 with one query): one more is added."""
    folder = _write(tmp_path / 'coll', {f'd{i}': t for i, t in enumerate(TEXTS)})
    index = dense_index(load_collection(folder), model, 'minilm', tmp_path / 'cache', ['d3'], verbose=False)
    assert sorted(_vectors(index)) == ['d0', 'd3'] and sorted(encoded) == sorted([TEXTS[0], TEXTS[3]])
    single = _write(tmp_path / 'single', {'d0': TEXTS[0]})
    for docnos in (None, ['d0']):
        with pytest.raises(ValueError, match="holds one document; a dense index .* needs at least two"):
            dense_index(load_collection(single), model, 'minilm', tmp_path / 'cache', docnos, verbose=False)


@pytest.mark.parametrize('damage', [
    lambda path: (path / 'vecs.f4').write_bytes((path / 'vecs.f4').read_bytes()[:-8]),
    lambda path: (path / FINGERPRINT).write_text('{"version": 1, "encoder": '),
    lambda path: (path / FINGERPRINT).write_bytes((path / FINGERPRINT).read_bytes().replace(b'true', b'1')),
    lambda path: (path / 'pt_meta.json').write_text('not json'),
    lambda path: (path / TEXT_HASHES).unlink(),
], ids=['truncated-vectors', 'truncated-record', 'edited-record', 'bad-meta', 'no-text-hashes'])
def test_a_damaged_cache_is_encoded_again(tmp_path, model, encoded, caplog, damage):
    folder = _write(tmp_path / 'coll', {f'd{i}': t for i, t in enumerate(TEXTS)})
    path = dense_index(load_collection(folder), model, 'minilm', tmp_path / 'cache', None, verbose=False).index_path
    damage(path)
    encoded.clear()
    with caplog.at_level(logging.WARNING, logger='pyterrier_rdime'):
        index = dense_index(load_collection(folder), model, 'minilm', tmp_path / 'cache', None, verbose=False)
    assert sorted(encoded) == sorted(TEXTS) and 'encoding again' in caplog.text
    _assert_same_vectors(_vectors(index), _from_scratch(tmp_path, folder, model))


def test_an_encoder_folder_is_keyed_by_its_name_and_content_not_its_path(tmp_path):
    for place in ('a', 'b'):
        shutil.copytree(encoders.bundled_minilm_path(), tmp_path / place / 'all-MiniLM-L6-v2')
    first, second = (encoder_slug(str(tmp_path / place / 'all-MiniLM-L6-v2')) for place in ('a', 'b'))
    assert first == second and first.startswith('all-MiniLM-L6-v2-')
    assert encoder_fingerprint(str(tmp_path / 'a' / 'all-MiniLM-L6-v2')) == encoder_fingerprint('minilm')


class _HashEncoder:
    """A stand-in encoder (no model: 600 documents in milliseconds) whose vector is a function of the text alone."""
    def encode_docs(self, texts, batch_size=None):
        return np.stack([np.random.default_rng(abs(hash(t)) % 2**32).standard_normal(8).astype(np.float32)
                         for t in texts])


def test_integer_docnos_in_long_runs_load_their_own_vectors(tmp_path):
    # npids' reverse lookup is wrong over several runs of >= 256 consecutive integer docnos (cranfield's 1..1400 in
    # corpus order gave 877 of 1,397 documents another row): the index is rewritten so that every docno finds its row
    docs = {str(i): f'document number {i}' for i in [*range(1, 301), *range(400, 700)]}
    folder = _write(tmp_path / 'coll', docs)
    encoder = _HashEncoder()
    index = dense_index(load_collection(folder), encoder, 'minilm', tmp_path / 'cache', list(docs), verbose=False)
    lookup, vecs, _ = index.payload()
    rows = np.asarray(lookup.inv[list(docs)])
    np.testing.assert_array_equal(np.asarray(vecs)[rows], encoder.encode_docs(list(docs.values())))
    stored = [str(d) for d in lookup.fwd[np.arange(len(docs))]]
    np.testing.assert_array_equal(np.load(index.index_path / TEXT_HASHES), text_hashes(docs[d] for d in stored))


def test_the_answers_vectors_are_encoded_once_per_call_and_a_damaged_record_again(tmp_path, model, caplog):
    """AnswerVectors: the encoder's own vectors, a call's answers encoded once across runs, a call of other answers
    (a subset: other padding, other last bits) encoded anew, a record that does not check encoded again with a
    warning, and an encoder's bad shape passed on for the DIME to report."""
    encoded = []

    class Counting:
        def encode_docs(self, texts):
            encoded.append(list(texts))
            return model.encode_docs(texts)
    path = tmp_path / 'answer-vectors' / 'minilm.pkl'
    first = encoders.AnswerVectors(Counting(), path).encode_docs(TEXTS)
    np.testing.assert_array_equal(first, model.encode_docs(TEXTS))
    later = encoders.AnswerVectors(Counting(), path).encode_docs(TEXTS)  # a later run
    np.testing.assert_array_equal(later, first)
    subset = encoders.AnswerVectors(Counting(), path).encode_docs(TEXTS[:2])
    np.testing.assert_array_equal(subset, model.encode_docs(TEXTS[:2]))  # not the first call's rows
    assert encoded == [TEXTS, TEXTS[:2]]
    path.write_bytes(path.read_bytes()[:-10])  # cut short
    with caplog.at_level(logging.WARNING):
        again = encoders.AnswerVectors(Counting(), path).encode_docs(TEXTS)
    assert 'do not read back' in caplog.text and encoded == [TEXTS, TEXTS[:2], TEXTS]
    np.testing.assert_array_equal(again, first)

    class Bad:
        def encode_docs(self, texts):
            return np.zeros(3)
    assert encoders.AnswerVectors(Bad(), path).encode_docs(['another answer']).shape == (3,)
