"""LLM DIME and LLM answers: answer vectors and texts, one encoding per answer, the magnitude fallback, answers
from a dict or a TSV file."""

import pytest
from frames import D1, D2, E1, E2, Q2, FakeEncoder, Q, assert_vec, one_row_per_query, queries, results, vec

from pyterrier_rdime import (
    LlmAnswers,
    LlmDime,
    Rdime,
)


def test_llm_dime_with_answer_vectors():
    inp = queries([('a', Q)], query_answer_vec=[vec((1, 1, 0, 2))])
    out = (LlmDime() >> Rdime()).transform(inp)
    row = out.iloc[0]
    assert_vec(row['query_dime'], [1, 2, 0, 8])
    assert row['query_eps2'] == pytest.approx(4.75)  # (30 - 11) / 4
    assert_vec(row['query_vec'], [0, 0, 0, 4])


def test_llm_dime_encodes_each_answer_once():
    enc = FakeEncoder()
    inp = results([('a', Q, 'd1', D1, 2.0), ('b', Q2, 'x', E1, 1.0), ('a', Q, 'd2', D2, 1.0),
                   ('b', Q2, 'y', E2, 0.5)])
    inp['query_answer'] = inp['qid'].map({'a': 'answer a', 'b': 'answer b'})
    out = LlmDime(encoder=enc).transform(inp)
    assert len(out) == 4
    assert sum(len(c) for c in enc.calls) == 2
    assert sorted(t for c in enc.calls for t in c) == ['answer a', 'answer b']
    dime = one_row_per_query(out, 'query_dime')
    assert_vec(dime['a'], [1, 2, 0, 8])
    assert_vec(dime['b'], [0, 0, -1, 0])


@pytest.mark.parametrize('missing', [None, float('nan'), '', '   '])
def test_llm_dime_missing_answer_text_falls_back_to_magnitude(missing):
    enc = FakeEncoder()
    inp = queries([('a', Q), ('b', Q2)], query_answer=['answer a', missing])
    with pytest.warns(UserWarning, match="'b'"):
        out = LlmDime(encoder=enc).transform(inp)
    by_qid = out.set_index('qid')
    assert_vec(by_qid.loc['a', 'query_dime'], [1, 2, 0, 8])
    assert_vec(by_qid.loc['b', 'query_dime'], [1, 0, 1, 4])  # q * q
    assert [t for c in enc.calls for t in c] == ['answer a']


def test_llm_dime_missing_answer_vector_falls_back_to_magnitude():
    inp = queries([('a', Q), ('b', Q2)], query_answer_vec=[vec((1, 1, 0, 2)), None])
    with pytest.warns(UserWarning, match='magnitude'):
        out = LlmDime().transform(inp)
    by_qid = out.set_index('qid')
    assert_vec(by_qid.loc['a', 'query_dime'], [1, 2, 0, 8])
    assert_vec(by_qid.loc['b', 'query_dime'], [1, 0, 1, 4])


def test_llm_answers_from_dict():
    inp = queries([('1', Q), ('2', Q), ('3', Q)])
    out = LlmAnswers(answers={'1': 'yes', '2': 'no'}).transform(inp)
    assert list(out.columns) == ['qid', 'query', 'query_vec', 'query_answer']
    assert out['query_answer'].tolist() == ['yes', 'no', None]


def test_llm_answers_from_tsv(tmp_path):
    path = tmp_path / 'answers.tsv'
    path.write_text('1\tanswer a\n\n2\tsays "hi"\tand more\n', encoding='utf-8')
    stage = LlmAnswers.from_tsv(path)
    assert stage.answers == {'1': 'answer a', '2': 'says "hi"\tand more'}
    out = stage.transform(queries([('2', Q), ('1', Q)]))
    assert out['query_answer'].tolist() == ['says "hi"\tand more', 'answer a']


def test_llm_answers_missing_error(tmp_path):
    path = tmp_path / 'answers.tsv'
    path.write_text('1\tanswer a\n', encoding='utf-8')
    with pytest.raises(ValueError, match="'7'"):
        LlmAnswers.from_tsv(path, missing='error').transform(queries([('1', Q), ('7', Q)]))


@pytest.mark.parametrize('content', ['1\ta\n1\tb\n', '1\ta\nno-tab-here\n'])
def test_llm_answers_bad_tsv(tmp_path, content):
    path = tmp_path / 'answers.tsv'
    path.write_text(content, encoding='utf-8')
    with pytest.raises(ValueError, match=':2:'):
        LlmAnswers.from_tsv(path)


def test_llm_answers_then_llm_dime_pipeline():
    enc = FakeEncoder()
    pipe = LlmAnswers(answers={'a': 'answer a'}) >> LlmDime(encoder=enc) >> Rdime()
    with pytest.warns(UserWarning, match="'b'"):
        out = pipe.transform(queries([('a', Q), ('b', Q2)]))
    by_qid = out.set_index('qid')
    assert_vec(by_qid.loc['a', 'query_vec'], [0, 0, 0, 4])
    assert_vec(by_qid.loc['b', 'query_dime'], [1, 0, 1, 4])
