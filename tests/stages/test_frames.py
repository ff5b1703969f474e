"""What every stage does with bad and empty frames (the shared edges in _frames): missing columns, non-finite and
mismatched vectors, missing qids, NaN scores, overflow, malformed answers, and empty input."""
import re
import tracemalloc
import warnings

import numpy as np
import pandas as pd
import pyterrier as pt
import pytest
from frames import D1, D2, DC, EX2, Q2, FakeEncoder, Q, assert_vec, interleaved, queries, results, topk_input, vec

from pyterrier_rdime import (
    EclipseDime,
    KernelDime,
    LlmAnswers,
    LlmDime,
    MagnitudeDime,
    OracleDime,
    PrfDime,
    Rdime,
    SwcDime,
    TopK,
    VectorScorer,
    read_answers_tsv,
)
from pyterrier_rdime.dime import FeedbackCutoff


@pytest.mark.parametrize('stage, drop', [
    (PrfDime(), 'doc_vec'), (SwcDime(), 'query_vec'), (KernelDime(), 'score'), (EclipseDime(), 'doc_vec'),
    (MagnitudeDime(), 'query_vec'), (VectorScorer(), 'doc_vec'), (VectorScorer(), 'docno'),
])
def test_missing_columns_raise_pyterrier_validation_error(stage, drop):
    inp = interleaved().drop(columns=[drop])
    with pytest.raises(pt.validate.InputValidationError, match=type(stage).__name__) as info:
        stage.transform(inp)
    assert drop in str(info.value)


@pytest.mark.parametrize('stage', [Rdime(), TopK()])
def test_threshold_without_query_dime(stage):
    with pytest.raises(pt.validate.InputValidationError) as info:
        stage.transform(queries([('q', Q)]))
    assert 'query_dime' in str(info.value)


def test_llm_dime_and_answers_missing_columns():
    with pytest.raises(pt.validate.InputValidationError):
        LlmDime().transform(queries([('q', Q)]))
    with pytest.raises(pt.validate.InputValidationError):
        LlmAnswers(answers={}).transform(pd.DataFrame({'query': ['x']}))
    with pytest.raises(ValueError, match='encoder'):
        LlmDime().transform(queries([('q', Q)], query_answer=['text']))


@pytest.mark.parametrize('stage', [PrfDime(), SwcDime(), EclipseDime(), MagnitudeDime(), VectorScorer()])
@pytest.mark.parametrize('bad', [np.nan, np.inf, -np.inf])
def test_non_finite_query_vec(stage, bad):
    inp = interleaved()
    inp['query_vec'] = [vec((1, bad, 3, 4)) if qid == 'q2' else v for qid, v in zip(inp['qid'], inp['query_vec'])]
    with pytest.raises(ValueError, match="qid='q2'") as info:
        stage.transform(inp)
    assert 'query_vec' in str(info.value) and type(stage).__name__ in str(info.value)


@pytest.mark.parametrize('stage', [PrfDime(), SwcDime(), EclipseDime(), VectorScorer()])
@pytest.mark.parametrize('bad', [np.nan, np.inf])
def test_non_finite_doc_vec(stage, bad):
    inp = interleaved()
    inp['doc_vec'] = [vec((bad, 0, 0, 0)) if d == 'dB' else v for d, v in zip(inp['docno'], inp['doc_vec'])]
    with pytest.raises(ValueError, match="docno='dB'") as info:
        stage.transform(inp)
    assert 'doc_vec' in str(info.value)


@pytest.mark.parametrize('stage', [Rdime(), TopK()])
def test_non_finite_query_dime(stage):
    with pytest.raises(ValueError, match="qid='q'"):
        stage.transform(topk_input((1, np.nan, 1, 1)))


@pytest.mark.parametrize('stage', [PrfDime(), SwcDime(), KernelDime(kernel='rbf'), EclipseDime(), VectorScorer()])
def test_query_doc_dimension_mismatch(stage):
    inp = interleaved()
    inp['doc_vec'] = [vec((1, 2, 3)) for _ in range(len(inp))]
    with pytest.raises(ValueError, match='dimensions') as info:
        stage.transform(inp)
    assert '4' in str(info.value) and '3' in str(info.value)


def test_doc_vectors_of_different_sizes():
    inp = interleaved()
    inp['doc_vec'] = [vec((1, 2, 3)) if d == 'dB' else v for d, v in zip(inp['docno'], inp['doc_vec'])]
    with pytest.raises(ValueError, match="docno='dB'"):
        PrfDime().transform(inp)


@pytest.mark.parametrize('stage', [Rdime(), TopK()])
def test_query_dime_dimension_mismatch(stage):
    with pytest.raises(ValueError, match='dimensions'):
        stage.transform(topk_input((1, 2, 3)))


def test_llm_answer_dimension_mismatch():
    with pytest.raises(ValueError, match=r"query_vec has 4 dimensions but query_answer_vec \(qid='q'\) has 2"):
        LlmDime().transform(queries([('q', Q)], query_answer_vec=[vec((1, 2))]))


def every_column():
    """The interleaved frame with the columns of every stage (query_dime, query_answer_vec, query_answer, rank)."""
    inp = interleaved().reset_index(drop=True)
    return inp.assign(query_dime=[vec((1, 4, 9, 16))] * len(inp), query_answer_vec=list(inp['query_vec']),
                      query_answer=['answer a'] * len(inp), rank=[0, 0, 1, 1, 2, 2])


QRELS_Q = pd.DataFrame({'qid': ['q1', 'q1'], 'docno': ['dA', 'dB'], 'label': [1, 0]})


EVERY_STAGE = [PrfDime(), SwcDime(), KernelDime(kernel='rank'), PrfDime(keep_ranking=False), EclipseDime(),
               MagnitudeDime(), OracleDime(qrels=QRELS_Q), LlmDime(), Rdime(), TopK(), VectorScorer(),
               LlmAnswers(answers={'q1': 'a'}), FeedbackCutoff(num_docs=2)]


@pytest.mark.parametrize('stage', EVERY_STAGE, ids=repr)
@pytest.mark.parametrize('missing', [np.nan, None, pd.NA], ids=['nan', 'none', 'pd.NA'])
def test_missing_qid_is_an_error_in_every_stage(stage, missing):
    inp = every_column()
    inp['qid'] = inp['qid'].astype(object)
    inp.loc[4, 'qid'] = missing  # docno dB of q1: a valid q1 row is left around it
    with pytest.raises(ValueError, match=r"column 'qid' is missing .* in 1 row\(s\), first at row 4 \(docno='dB'") \
            as info:
        stage.transform(inp)
    assert str(info.value).startswith(f'{stage}: ') and 'dropna' in str(info.value)


def test_missing_qid_is_an_error_in_a_query_frame():
    inp = queries([('a', Q), ('b', Q2)], query_dime=[vec(Q), vec(Q2)]).astype({'qid': object})
    inp.loc[0, 'qid'] = None
    for stage in (MagnitudeDime(), Rdime(), TopK(count=2)):
        with pytest.raises(ValueError, match=r"first at row 0 \(query='text of a'\)"):
            stage.transform(inp)


@pytest.mark.parametrize('stage', [PrfDime(), SwcDime(), EclipseDime(), OracleDime(qrels=QRELS_Q),
                                   FeedbackCutoff(num_docs=2)], ids=repr)
def test_nan_score_is_an_error_naming_the_candidate(stage):
    inp = interleaved()
    inp.loc[inp['docno'] == 'e1', 'score'] = np.nan
    with pytest.raises(ValueError, match=r"column 'score' is NaN at qid='q2', docno='e1' \(1 row\(s\)\)"):
        stage.transform(inp)


def test_num_docs_far_beyond_the_candidates_costs_memory_of_the_candidates():
    inp = results([('q', Q, 'd1', D1, 4.0), ('q', Q, 'd2', D2, 3.0), ('q', Q, 'd3', EX2, 2.0), ('q', Q, 'd4', DC, 1.0)])
    tracemalloc.start()
    try:
        huge = PrfDime(num_docs=10 ** 8).transform(inp)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 10 * 2 ** 20, peak  # padding to 10^8 slots would take gigabytes
    # mean of the four documents: [102.4, 102.2, 104.8, 102.1] / 4, times q
    expected = [102.4 / 4, 2 * 102.2 / 4, 3 * 104.8 / 4, 4 * 102.1 / 4]
    assert_vec(huge['query_dime'].iloc[0], expected, atol=1e-4)
    # every candidate is a positive, so no negative is left: only the alpha term
    assert_vec(EclipseDime(num_pos=10 ** 8, num_neg=10 ** 8).transform(inp)['query_dime'].iloc[0], expected, atol=1e-4)


@pytest.mark.parametrize('stage', [PrfDime(), SwcDime(), EclipseDime(), MagnitudeDime()], ids=repr)
def test_vectors_that_overflow_float32_importance_are_blamed_where_it_happens(stage):
    inp = interleaved()
    inp['query_vec'] = [v * np.float32(1e20) if qid == 'q2' else v for qid, v in zip(inp['qid'], inp['query_vec'])]
    inp['doc_vec'] = [v * np.float32(1e20) for v in inp['doc_vec']]
    assert all(np.isfinite(v).all() for v in inp['query_vec'])  # finite float32 input
    with pytest.raises(ValueError, match=r"query_dime of qid='q2' reaches \d\.?\d*e\+4\d, beyond float32 .*"
                                         r'values up to 2e\+20\. Normalise') as info:
        (stage >> Rdime()).transform(inp)
    assert str(info.value).startswith(f'{stage}: ')


def test_vector_scorer_overflow_names_the_candidate():
    inp = interleaved()
    inp['query_vec'] = [v * np.float32(1e20) for v in inp['query_vec']]
    inp['doc_vec'] = [v * np.float32(1e20) if d == 'dC' else v for d, v in zip(inp['docno'], inp['doc_vec'])]
    with pytest.raises(ValueError, match=r"qid='q1' and docno='dC' overflows float32 \(vector values up to 4e\+20 "
                                         r'and 1e\+22\); normalise'):
        VectorScorer().transform(inp)


@pytest.mark.parametrize('bad, message', [
    (np.array([[1, 1, 0, 2]], dtype=np.float32), r"query_answer_vec' at qid='b' holds ndarray of shape \(1, 4\)"),
    (vec((1, 1)), r"query_answer_vec' holds vectors of different sizes \(qid='b' has 2, qid='a' has 4\)"),
    (vec((1, np.nan, 0, 2)), r"query_answer_vec' holds NaN or inf at qid='b'"),
    (vec(()), r"query_answer_vec' at qid='b' holds ndarray of shape \(0,\)"),
    (np.float32(3.0), r"query_answer_vec' at qid='b' holds float32 of shape \(\)"),
    ('an answer', r"query_answer_vec' at qid='b' holds str"),
])
def test_malformed_answer_vector_is_an_error_naming_the_qid(bad, message):
    inp = queries([('a', Q), ('b', Q2)], query_answer_vec=[vec(Q), bad])
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # not the silent "no LLM answer" fallback
        with pytest.raises(ValueError, match=message):
            LlmDime().transform(inp)


@pytest.mark.parametrize('missing', [None, np.nan, pd.NA], ids=['none', 'nan', 'pd.NA'])
def test_missing_answer_vector_falls_back_with_a_warning(missing):
    inp = queries([('a', Q), ('b', Q2)], query_answer_vec=[vec((1, 1, 0, 2)), missing])
    with pytest.warns(UserWarning, match=r"no LLM answer for 1 query \('b'\); using magnitude"):
        out = LlmDime().transform(inp).set_index('qid')
    assert_vec(out.loc['a', 'query_dime'], [1, 2, 0, 8])
    assert_vec(out.loc['b', 'query_dime'], [1, 0, 1, 4])


class BadEncoder:
    def __init__(self, output):
        self.output = output

    def encode_docs(self, texts):
        return self.output

    def __repr__(self):
        return 'BadEncoder()'


@pytest.mark.parametrize('output, message', [
    (np.array([[1, 1, 0, 2], [0, np.nan, 1, 0]], dtype=np.float32),
     r"encode_docs returned NaN or inf for the query_answer of qid='b'"),
    (np.ones((1, 4), dtype=np.float32), r'encode_docs returned shape \(1, 4\) for 2 answer texts; .*\(2, 4\)'),
    (np.ones((3, 4), dtype=np.float32), r'encode_docs returned shape \(3, 4\) for 2 answer texts'),
    (np.ones(8, dtype=np.float32), r'encode_docs returned shape \(8,\) for 2 answer texts'),
    (np.ones((2, 3), dtype=np.float32), r'query_vec has 4 dimensions but the encoded query_answer has 3'),
])
def test_bad_encoder_output_is_an_error(output, message):
    inp = queries([('a', Q), ('b', Q2)], query_answer=['answer a', 'answer b'])
    with pytest.raises(ValueError, match=message) as info:
        LlmDime(encoder=BadEncoder(output)).transform(inp)
    assert str(info.value).startswith('LlmDime(encoder=BadEncoder()): ')


def test_answer_text_that_is_not_text_is_an_error():
    inp = queries([('a', Q), ('b', Q2)], query_answer=['answer a', 5])
    with pytest.raises(ValueError, match=r"query_answer of qid='b' is 5 \(int\), not text"):
        LlmDime(encoder=FakeEncoder()).transform(inp)


def test_llm_answers_file_with_a_byte_order_mark(tmp_path):
    path = tmp_path / 'answers.tsv'
    path.write_bytes('q1\tfirst answer\nq2\tsecond é\n'.encode('utf-8-sig'))
    assert read_answers_tsv(path) == {'q1': 'first answer', 'q2': 'second é'}


def test_llm_answers_file_not_in_utf8_names_the_file_line_and_fix(tmp_path):
    path = tmp_path / 'answers.tsv'
    path.write_bytes('q1\tfirst answer\nq2\tcaf\xe9 au lait\n'.encode('latin-1'))
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}:2: not UTF-8 .*iconv -f latin1 -t utf-8"):
        read_answers_tsv(path)


def test_llm_answers_file_with_an_empty_qid(tmp_path):
    path = tmp_path / 'answers.tsv'
    path.write_text('q1\ta\n\tb\n', encoding='utf-8')
    with pytest.raises(ValueError, match=":2: qid '' is empty or holds whitespace"):
        read_answers_tsv(path)


def test_llm_answers_nan_value_is_a_missing_answer():
    out = LlmAnswers(answers={'1': 'yes', '2': np.nan}).transform(queries([('1', Q), ('2', Q)]))
    assert out['query_answer'].tolist() == ['yes', None]
    with pytest.raises(ValueError, match="no answer for qid '2'"):
        LlmAnswers(answers={'1': 'yes', '2': np.nan}, missing='error').transform(queries([('1', Q), ('2', Q)]))


RESULT_COLUMNS = ['qid', 'query', 'query_vec', 'docno', 'doc_vec', 'score']


@pytest.mark.parametrize('stage, expected', [
    (PrfDime(), RESULT_COLUMNS + ['query_dime']),
    (SwcDime(), RESULT_COLUMNS + ['query_dime']),
    (KernelDime(kernel='sigmoid'), RESULT_COLUMNS + ['query_dime']),
    (EclipseDime(), RESULT_COLUMNS + ['query_dime']),
    (MagnitudeDime(), RESULT_COLUMNS + ['query_dime']),
    (OracleDime(qrels=pd.DataFrame({'qid': ['1'], 'docno': ['a'], 'label': [1]})), RESULT_COLUMNS + ['query_dime']),
    (PrfDime(keep_ranking=False), ['qid', 'query', 'query_vec', 'query_dime']),
    (EclipseDime(keep_ranking=False), ['qid', 'query', 'query_vec', 'query_dime']),
    (VectorScorer(), RESULT_COLUMNS + ['rank']),
    (LlmAnswers(answers={'1': 'a'}), RESULT_COLUMNS + ['query_answer']),
    (PrfDime() >> TopK() >> VectorScorer(), RESULT_COLUMNS + ['query_dime', 'query_vec_full', 'query_kept',
                                                'query_kept_frac', 'rank']),
])
def test_empty_result_frame(stage, expected):
    out = stage.transform(interleaved().iloc[:0])
    assert isinstance(out, pd.DataFrame) and len(out) == 0
    assert list(out.columns) == expected


@pytest.mark.parametrize('stage, expected', [
    (Rdime(), ['query_vec_full', 'query_kept', 'query_kept_frac', 'query_eps2', 'query_fallback']),
    (TopK(), ['query_vec_full', 'query_kept', 'query_kept_frac']),
])
def test_empty_threshold_input(stage, expected):
    out = stage.transform(topk_input().iloc[:0])
    assert len(out) == 0
    assert list(out.columns)[:4 + len(expected)] == ['qid', 'query', 'query_vec', 'query_dime'] + expected


def test_empty_llm_dime_input():
    out = LlmDime().transform(queries([('q', Q)], query_answer_vec=[vec(Q)]).iloc[:0])
    assert len(out) == 0 and list(out.columns) == ['qid', 'query', 'query_vec', 'query_answer_vec', 'query_dime']
    out = LlmDime(encoder=FakeEncoder()).transform(queries([('q', Q)], query_answer=['answer a']).iloc[:0])
    assert len(out) == 0 and list(out.columns) == ['qid', 'query', 'query_vec', 'query_answer', 'query_dime']
