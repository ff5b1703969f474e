"""Published LLM answers by name: the CSV they come in, the catalogue, the one download into the cache (served here
from local files: no test touches the network), the collection folder's llm_answers/<name>.tsv, and the one-line
error offline."""
import dataclasses
import hashlib
import json
import urllib.request

import pytest
from conftest import shared_collection

from pyterrier_rdime import LlmAnswers
from pyterrier_rdime.experiment.cli import main
from pyterrier_rdime.experiment.collection import load_collection
from pyterrier_rdime.experiment.systems import answer_sources
from pyterrier_rdime.llm import published, read_answers_csv, read_answers_tsv
from pyterrier_rdime.llm.published import CATALOGUE, Published, cached_path, fetch, published_entry

# a record spanning lines, with commas and doubled quotes; an unquoted one; a quoted query holding a comma
CSV = ('156493,do goldfish grow,"Yes, they do.\n\nSome say ""1 foot"", others more."\n'
       '1117099,what is a active margin,An active margin is a plate boundary.\n'
       '130510,"definition, declaratory judgment","A ruling ""declaring"" rights,\nnot damages."\n')
PARSED = {'156493': 'Yes, they do.\n\nSome say "1 foot", others more.',
          '1117099': 'An active margin is a plate boundary.',
          '130510': 'A ruling "declaring" rights,\nnot damages.'}


def test_csv_with_newlines_commas_and_doubled_quotes(tmp_path):
    path = tmp_path / 'gpt-4.txt'
    path.write_text(CSV, encoding='utf-8')
    assert read_answers_csv(path) == PARSED
    assert list(read_answers_csv(path)) == ['156493', '1117099', '130510']  # file order


def test_csv_header_row_is_skipped(tmp_path):
    """DIME's gpt4_answers.csv starts with query_id,text,response."""
    path = tmp_path / 'gpt4_answers.csv'
    path.write_text('query_id,text,response\n' + CSV, encoding='utf-8')
    assert read_answers_csv(path) == PARSED


@pytest.mark.parametrize('content, line, message', [
    ('1,q,"a"\n2,q,b,c\n', 2, '4 fields'),
    ('1,q,"a\nb"\n3,q,x\n1,q,again\n', 4, "qid '1' is also on line 1"),
    ('1,q,a\n2.0,q,b\n', 2, "write it as '2'"),
    ('1,q,"never closed\n', 1, 'unexpected end of data'),
])
def test_bad_csv_names_file_and_line(tmp_path, content, line, message):
    path = tmp_path / 'answers.txt'
    path.write_text(content, encoding='utf-8')
    with pytest.raises(ValueError, match=rf'answers.txt:{line}: .*{message}'):
        read_answers_csv(path)


def test_tsv_qid_written_as_a_float_is_refused_when_read(tmp_path, capsys):
    """Issue 39: '1.0' matched no query and failed only when the cell ran; now reading the file refuses it."""
    path = tmp_path / 'answers.tsv'
    path.write_text('1\tone\n\n2.0\ttwo\n', encoding='utf-8')
    with pytest.raises(ValueError, match=r"answers.tsv:3: qid '2.0' is an integer written as a float.*'2'"):
        read_answers_tsv(path)
    assert main([str(shared_collection('cranfield')), '--answers', str(path), '--out', str(tmp_path / 'out'),
                 '--cache', str(tmp_path / 'cache')]) == 2
    assert f"{path}:3: qid '2.0'" in capsys.readouterr().err


def test_catalogue_declares_each_file_pinned_to_its_commit():
    names = {'gpt-4', 'gpt-4o', 'qwen2.5-3b', 'qwen2.5-7b', 'qwen2.5-32b', 'llama-3.1-8b', 'llama-3.2-3b',
             'deepseek-r1-qwen-7b', 'deepseek-r1-qwen-32b'}
    for dataset in (published.DL19, published.DL20, published.DL_HARD):
        assert {n for n, d in CATALOGUE if d == dataset} == names | {'gpt-4-dime'}
    assert {n for n, d in CATALOGUE if d == published.ROBUST04} == {'gpt-4', 'gpt-4-dime'}
    for entry in CATALOGUE.values():
        assert entry.url.startswith('https://raw.githubusercontent.com/')
        assert ('/7b0644950fc08fcfb8eee07f9481112b2ad9a0b9/llm_docs/' in entry.url
                or entry.url.endswith('/f59412adccfa339c9755fff34d6727759551d91a/data/gpt4_answers.csv'))
    sources = (shared_collection('msmarco-dl19-pool') / 'llm_answers' / 'SOURCES.md').read_text(encoding='utf-8')
    for name in names:  # the sha256 of the DL19 files are those recorded with the shared copies
        entry = published_entry(name, 'irds:' + published.DL19)
        assert f'`{entry.file_name}` | {entry.sha256} |' in sources
    assert published_entry('qwen2.5-3b', published.DL20).url.endswith(
        'msmarco-passage_trec-dl-2020_judged/Qwen_Qwen2.5-3B-Instruct-GPTQ-Int4.txt')


@pytest.mark.parametrize('name, dataset, message', [
    ('gpt-5', published.DL19, "no 'gpt-5' for msmarco-passage/trec-dl-2019/judged; published for it: .*qwen2.5-3b"),
    ('gpt-5', 'vaswani', "no 'gpt-5'; the catalogue has .*gpt-4"),
    ('qwen2.5-3b', published.ROBUST04, "no 'qwen2.5-3b' for disks45/nocr/trec-robust-2004; published for it: gpt-4"),
])
def test_unknown_entries_say_what_there_is(name, dataset, message):
    with pytest.raises(ValueError, match=message):
        published_entry(name, dataset)


def _entry(path, sha256='unset'):
    data = path.read_bytes()
    return Published('gpt-4', 'gpt-4', published.DL19, 'test', path.as_uri(),
                     hashlib.sha256(data).hexdigest() if sha256 == 'unset' else sha256)


def test_fetch_downloads_once_and_checks_the_bytes(tmp_path, monkeypatch):
    source = tmp_path / 'served' / 'gpt-4.txt'
    source.parent.mkdir()
    source.write_text(CSV, encoding='utf-8')
    entry = _entry(source)
    path = fetch(entry, tmp_path / 'cache')
    assert path == cached_path(entry, tmp_path / 'cache') and path.read_bytes() == source.read_bytes()

    def offline(*args, **kwargs):
        raise urllib.error.URLError('no network')
    monkeypatch.setattr(urllib.request, 'urlopen', offline)
    assert fetch(entry, tmp_path / 'cache') == path  # from the cache: no second download
    path.write_text(CSV.replace('1 foot', '2 feet'), encoding='utf-8')  # a damaged copy is not trusted
    with pytest.raises(ConnectionError) as error:
        fetch(entry, tmp_path / 'cache')
    message = str(error.value)
    assert '\n' not in message and entry.url in message and str(path) in message and '--answers FILE' in message


def test_fetch_refuses_bytes_other_than_catalogued(tmp_path):
    source = tmp_path / 'gpt-4.txt'
    source.write_text(CSV, encoding='utf-8')
    with pytest.raises(ValueError, match='not the catalogued 0000'):
        fetch(_entry(source, '0' * 64), tmp_path / 'cache')
    assert not cached_path(_entry(source), tmp_path / 'cache').exists()


def test_fetch_without_a_catalogued_sha256_records_the_first_download(tmp_path):
    source = tmp_path / 'gpt-4.txt'
    source.write_text(CSV, encoding='utf-8')
    entry = _entry(source, None)
    path = fetch(entry, tmp_path / 'cache')
    assert path.with_name('gpt-4.txt.sha256').read_text().strip() == hashlib.sha256(CSV.encode()).hexdigest()
    source.write_text(CSV + '9,q,a later edit\n', encoding='utf-8')
    path.write_text(CSV + '9,q,a later edit\n', encoding='utf-8')  # the cached copy edited: downloaded again
    assert fetch(entry, tmp_path / 'cache').read_text(encoding='utf-8').endswith('a later edit\n')


def test_llm_answers_published_by_name(tmp_path, monkeypatch):
    source = tmp_path / 'gpt-4.txt'
    source.write_text(CSV, encoding='utf-8')
    monkeypatch.setitem(CATALOGUE, ('gpt-4', published.DL20), dataclasses.replace(_entry(source),
                                                                                  dataset=published.DL20))
    stage = LlmAnswers.published('gpt-4', 'irds:msmarco-passage/trec-dl-2020/judged', cache=tmp_path / 'cache')
    assert stage.answers == PARSED


@pytest.fixture
def pool(tmp_path):
    """A collection folder offering two answer sources in llm_answers/, as the shared DL19 pool does."""
    folder = tmp_path / 'pool'
    folder.mkdir()
    (folder / 'docs.jsonl').write_text(''.join(json.dumps({'docno': f'd{i}', 'text': f'text {i}'}) + '\n'
                                               for i in range(3)))
    (folder / 'queries.tsv').write_text('1\tfirst\n2\tsecond\n')
    (folder / 'qrels').write_text('1 0 d0 1\n2 0 d1 1\n')
    (folder / 'llm_answers').mkdir()
    (folder / 'llm_answers' / 'big.tsv').write_text('1\tbig one\n2\tbig two\n')
    (folder / 'llm_answers' / 'small.tsv').write_text('1\tsmall one\n')
    return folder


def test_names_are_read_from_the_collection_folder(pool, tmp_path):
    collection = load_collection(str(pool))
    sources = answer_sources('big,small', collection, tmp_path)
    assert sources == {'big': {'1': 'big one', '2': 'big two'}, 'small': {'1': 'small one'}}
    assert answer_sources(None, collection, tmp_path) == {}  # no llm_answers.tsv of its own
    single = tmp_path / 'mine.tsv'
    single.write_text('1\tmine\n')
    assert answer_sources(str(single), collection, tmp_path) == {'': {'1': 'mine'}}  # one file: the plain LLM row
    assert list(answer_sources(f'{single},big', collection, tmp_path)) == ['mine', 'big']


def test_a_name_without_a_local_copy_is_one_line_with_the_fix(pool, tmp_path, capsys):
    assert main([str(pool), '--answers', 'big,gpt-4', '--dimes', 'llm', '--out', str(tmp_path / 'out'),
                 '--cache', str(tmp_path / 'cache')]) == 2
    err = capsys.readouterr().err.strip()
    assert '\n' not in err
    assert (f'--answers gpt-4: {pool} has no llm_answers/gpt-4.tsv (it has big, small); put the answers there '
            '(qid<TAB>answer) or pass --answers FILE') in err
    assert 'irds:msmarco-passage/trec-dl-2019/judged' in err


def test_offline_irds_name_is_one_line_naming_url_place_and_fix(tmp_path, monkeypatch):
    def offline(*args, **kwargs):
        raise urllib.error.URLError('[Errno -3] Temporary failure in name resolution')
    monkeypatch.setattr(urllib.request, 'urlopen', offline)
    entry = published_entry('qwen2.5-3b', published.DL_HARD)
    with pytest.raises(ConnectionError) as error:
        fetch(entry, tmp_path)
    message = str(error.value)
    assert '\n' not in message
    assert entry.url in message and str(cached_path(entry, tmp_path)) in message and '--answers FILE' in message


@pytest.mark.parametrize('spec, message', [('missing.tsv', 'no such file'), ('a b', 'nor a name'), (',', 'names no')])
def test_bad_answers_option(spec, message, pool, tmp_path):
    with pytest.raises(ValueError, match=message):
        answer_sources(spec, load_collection(str(pool)), tmp_path)
