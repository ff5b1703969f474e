"""The anchors' other DIME variants, on hand-computed vectors: the score-mass threshold (``ScoreMass``), Eclipse with
an LLM answer as the positive (``LlmEclipseDime``), active feedback from judged documents (``ActiveFeedbackDime``)
and ``OracleDime``'s padding of queries without a judged non-relevant candidate."""
import itertools

import numpy as np
import pandas as pd
import pyterrier as pt
import pytest
from frames import FakeEncoder, Q, assert_vec, one_row_per_query, results, topk_input, vec

from pyterrier_rdime import ActiveFeedbackDime, LlmEclipseDime, OracleDime, PrfDime, ScoreMass, TopK

U1 = (0.9, 4.2, 8.4, 0.4)  # worked example 1, total positive mass 13.9
U2 = (0.5, 0.2, 3.0, -4.0)  # worked example 2, total positive mass 3.7


# ----------------------------------------------------------------------------------------------------------------
# ScoreMass
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize('dime, mass, expected', [
    (U1, 0.5, [0, 0, 3, 0]),  # 8.4 / 13.9 = 0.60 >= 0.5
    (U1, 0.7, [0, 2, 3, 0]),  # 8.4 < 9.73; 12.6 >= 9.73
    (U1, 0.95, [1, 2, 3, 0]),  # 12.6 < 13.205; 13.5 >= 13.205
    (U1, 1.0, [1, 2, 3, 4]),
    (U2, 1.0, [1, 2, 3, 0]),  # u = -4 adds no mass: mass 1 keeps exactly the u > 0
    (U2, 0.8, [0, 0, 3, 0]),  # 3.0 / 3.7 = 0.81
    ((4, 3, 2, 1), 0.7, [1, 2, 0, 0]),  # 7 / 10 is exactly 0.7: reached, no third dimension
    ((4, 3, 2, 1), 0.71, [1, 2, 3, 0]),
    ((1, 1, 1, 1), 0.5, [1, 2, 0, 0]),  # ties keep the lower index
])
def test_score_mass_keeps_the_top_until_the_share_is_reached(dime, mass, expected):
    out = ScoreMass(mass=mass).transform(topk_input(dime))
    assert_vec(out['query_vec'][0], expected)
    kept = int(np.count_nonzero(expected))
    assert out['query_kept'][0] == kept and out['query_kept_frac'][0] == pytest.approx(kept / 4)
    assert not out['query_fallback'][0]
    assert_vec(out['query_vec_full'][0], Q)


@pytest.mark.parametrize('fallback, expected', [('full', [1, 2, 3, 4]), ('top1', [0, 2, 0, 0])])
def test_score_mass_without_positive_importance_falls_back(fallback, expected):
    out = ScoreMass(mass=0.5, fallback=fallback).transform(topk_input((-1, 0, -2, -3)))
    assert_vec(out['query_vec'][0], expected)
    assert bool(out['query_fallback'][0]) and out['query_kept'][0] == np.count_nonzero(expected)


def test_score_mass_after_prf_per_query():
    rows = [('q1', Q, 'a', (0.9, 2.1, 2.8, 0.1), 2.0), ('q2', (1, 1, 1, 1), 'b', (1, 0, 0, 3), 1.0)]
    out = (PrfDime(num_docs=1) >> ScoreMass(mass=0.6)).transform(results(rows))
    pruned = one_row_per_query(out, 'query_vec')
    assert_vec(pruned['q1'], [0, 0, 3, 0])  # u = U1: 8.4 / 13.9 >= 0.6
    assert_vec(pruned['q2'], [0, 0, 0, 1])  # u = [1, 0, 0, 3]: 3 / 4 >= 0.6


@pytest.mark.parametrize('kwargs, message', [
    ({'mass': 0}, 'mass must be a fraction in (0, 1]'), ({'mass': 1.5}, 'mass must be a fraction in (0, 1]'),
    ({'mass': True}, 'mass must be a fraction'), ({'fallback': 'none'}, 'fallback must be one of'),
])
def test_score_mass_invalid_arguments(kwargs, message):
    with pytest.raises(ValueError, match='^ScoreMass: ') as e:
        ScoreMass(**kwargs)
    assert message in str(e.value)


def test_score_mass_repr_and_equality():
    assert repr(ScoreMass()) == 'ScoreMass()' and repr(ScoreMass(mass=0.5)) == 'ScoreMass(mass=0.5)'
    assert ScoreMass(mass=0.5) == ScoreMass(mass=0.5) and ScoreMass(mass=0.5) != ScoreMass(mass=0.6)
    assert ScoreMass(mass=1) == ScoreMass(mass=1.0)  # stored as a float, like TopK's fraction


# ----------------------------------------------------------------------------------------------------------------
# LlmEclipseDime
# ----------------------------------------------------------------------------------------------------------------

X1, X2, X3, X4 = (1, 0, 0, 0), (0, 1, 0, 0), (0, 0, 2, 2), (1, 1, 1, 1)
ANSWER = (1, 1, 0, 2)  # FakeEncoder's 'answer a'


def ranking(qid='q', **extra):
    frame = results([(qid, Q, 'x1', X1, 3.0), (qid, Q, 'x2', X2, 2.0), (qid, Q, 'x3', X3, 1.0)])
    return frame.assign(**{k: [v] * len(frame) for k, v in extra.items()})


@pytest.mark.parametrize('kwargs, expected', [
    ({'num_neg': 2}, [1, 1.5, -1.5, 6]),  # q*a = [1, 2, 0, 8]; bottom two x3, x2: q*mean = [0, 1, 3, 4]
    ({'num_neg': 2, 'alpha': 2.0, 'beta': 1.0}, [2, 3, -3, 12]),
    ({}, [5 / 6, 5 / 3, -1, 20 / 3]),  # num_neg = 5 > 3 candidates: all three, q*mean = [1/3, 2/3, 2, 8/3]
    ({'num_neg': 2, 'alpha': 0.0}, [0, -0.5, -1.5, -2]),
])
def test_llm_eclipse_hand_computed(kwargs, expected):
    out = LlmEclipseDime(**kwargs).transform(ranking(query_answer_vec=vec(ANSWER)))
    assert_vec(one_row_per_query(out, 'query_dime')['q'], expected)
    assert len(out) == 3


def test_llm_eclipse_encodes_answer_text():
    encoder = FakeEncoder()
    out = LlmEclipseDime(encoder=encoder, num_neg=2).transform(ranking(query_answer='answer a'))
    assert_vec(out['query_dime'][0], [1, 1.5, -1.5, 6])
    assert encoder.calls == [['answer a']]


def test_llm_eclipse_without_an_answer_uses_the_query_as_positive():
    frame = pd.concat([ranking('q', query_answer_vec=None), ranking('r', query_answer_vec=vec(ANSWER))],
                      ignore_index=True)
    with pytest.warns(UserWarning, match=r"no LLM answer for 1 query \('q'\)"):
        out = LlmEclipseDime(num_neg=2).transform(frame)
    dimes = one_row_per_query(out, 'query_dime')
    assert_vec(dimes['q'], [1, 3.5, 7.5, 14])  # q*q - 0.5 * q*mean(x3, x2)
    assert_vec(dimes['r'], [1, 1.5, -1.5, 6])


def test_llm_eclipse_one_row_per_query_and_errors():
    out = LlmEclipseDime(num_neg=2, keep_ranking=False).transform(ranking(query_answer_vec=vec(ANSWER)))
    assert len(out) == 1 and 'docno' not in out.columns
    with pytest.raises(pt.validate.InputValidationError):
        LlmEclipseDime().transform(ranking())  # no answer column
    with pytest.raises(ValueError, match='no encoder was given; use LlmEclipseDime'):
        LlmEclipseDime().transform(ranking(query_answer='answer a'))
    with pytest.raises(ValueError, match='^LlmEclipseDime: alpha and beta are both 0'):
        LlmEclipseDime(alpha=0, beta=0)
    with pytest.raises(ValueError, match='^LlmEclipseDime: encoder .* has no encode_docs'):
        LlmEclipseDime(encoder=object())
    assert LlmEclipseDime().compile() == LlmEclipseDime()  # the bottom of the ranking is needed: no cut


# ----------------------------------------------------------------------------------------------------------------
# ActiveFeedbackDime
# ----------------------------------------------------------------------------------------------------------------

def candidates(qid='q'):
    return results([(qid, Q, 'x1', X1, 3.0), (qid, Q, 'x2', X2, 2.0), (qid, Q, 'x3', X3, 1.0),
                    (qid, Q, 'x4', X4, 0.5), (qid, Q, 'x5', (5, 5, 5, 5), 0.1)])


def qrels(qid='q', **labels):
    return pd.DataFrame({'qid': qid, 'docno': list(labels), 'label': list(labels.values())})


@pytest.mark.parametrize('labels, beta, expected', [
    ({'x2': 2, 'x3': 2, 'x1': 1}, 0.0, [0, 2, 0, 0]),  # highest label; x2 and x3 tie: the higher-scored x2
    ({'x3': 2, 'x2': 1}, 0.0, [0, 0, 6, 8]),  # the highest label wins over the higher score
    ({'x2': 2, 'x4': -1, 'x1': 0}, 0.5, [-0.5, 1, -1.5, -2]),  # the lowest label is the negative: x4
    ({'x2': 2, 'x4': 0, 'x1': 0}, 0.5, [-0.5, 2, 0, 0]),  # x1 and x4 tie at 0: the higher-scored x1
    ({'x2': 2, 'x4': 0, 'x1': 0, 'other': 3}, 1.0, [-1, 2, 0, 0]),  # an unretrieved judgment is not usable
])
def test_active_feedback_hand_computed(labels, beta, expected):
    out = ActiveFeedbackDime(qrels=qrels(**labels), beta=beta).transform(candidates())
    assert_vec(out['query_dime'][0], expected)


def test_active_feedback_without_a_relevant_candidate_falls_back_to_magnitude():
    judged = pd.concat([qrels('q', x1=0), qrels('r', x2=1)])
    with pytest.warns(UserWarning, match=r"no judged relevant candidate for 1 query \('q'\)"):
        out = ActiveFeedbackDime(qrels=judged).transform(pd.concat([candidates('q'), candidates('r')]))
    dimes = one_row_per_query(out, 'query_dime')
    assert_vec(dimes['q'], [1, 4, 9, 16])
    assert_vec(dimes['r'], [0, 2, 0, 0])


def test_active_feedback_without_a_non_relevant_candidate_has_no_negative_term():
    with pytest.warns(UserWarning, match=r"no judged non-relevant candidate for 1 query \('q'\); no negative term"):
        out = ActiveFeedbackDime(qrels=qrels(x3=1), beta=0.5).transform(candidates())
    assert_vec(out['query_dime'][0], [0, 0, 6, 8])


def test_active_feedback_matches_qids_as_text_and_validates():
    judged = pd.DataFrame({'qid': [7], 'docno': ['x2'], 'label': [1]})
    out = ActiveFeedbackDime(qrels=judged).transform(candidates('7'))
    assert_vec(out['query_dime'][0], [0, 2, 0, 0])
    with pytest.raises(ValueError, match='^ActiveFeedbackDime: qrels must be a DataFrame with columns'):
        ActiveFeedbackDime(qrels=pd.DataFrame({'qid': ['q']}))
    with pytest.raises(ValueError, match='^ActiveFeedbackDime: beta must be a non-negative number'):
        ActiveFeedbackDime(qrels=judged, beta=-1)
    assert repr(ActiveFeedbackDime(qrels=judged, beta=0.5)) == \
        'ActiveFeedbackDime(qrels=<DataFrame of 1 rows>, beta=0.5)'
    assert ActiveFeedbackDime(qrels=judged) == ActiveFeedbackDime(qrels=judged)
    assert ActiveFeedbackDime(qrels=judged) != ActiveFeedbackDime(qrels=judged, beta=0.5)


@pytest.mark.parametrize('stage', [ActiveFeedbackDime, OracleDime])
@pytest.mark.parametrize('input_qid, qrels_qid, floats', [('7', 7.0, 'the qrels'), ('7.0', '7', 'the input')])
def test_an_integer_qid_written_as_a_float_on_one_side_is_named(stage, input_qid, qrels_qid, floats):
    # pandas reads a qid column of integers with a gap as floats: '7' then matches no judgment ('7.0')
    judged = pd.DataFrame({'qid': [qrels_qid], 'docno': ['x2'], 'label': [1]})
    with pytest.raises(ValueError, match=rf"^{stage.__name__}\(.*\): qid '{input_qid}' of the input has no entry in "
                                         rf"the qrels, but the qrels have qid '{str(qrels_qid)}': the same integer "
                                         rf"qid, written as a float in {floats}"):
        stage(qrels=judged).transform(candidates(input_qid))


# ----------------------------------------------------------------------------------------------------------------
# OracleDime(pad_negatives=True)
# ----------------------------------------------------------------------------------------------------------------

RNG = np.random.default_rng(3)
DOCS = {docno: RNG.standard_normal(4) for docno in ['u0', 'u1', 'u2', 'u3', 'u4', 'u5', 'r1', 'r2', 'n1']}


def oracle_frame(qid, docnos):
    return results([(qid, Q, d, DOCS[d], float(-i)) for i, d in enumerate(docnos)])


ALL_RELEVANT = pd.DataFrame({'qid': 'a', 'docno': ['r1', 'r2'], 'label': [1, 2]})
UNJUDGED = [f'u{i}' for i in range(6)]


def plain_oracle(qid, docnos, judged):
    return OracleDime(qrels=judged).transform(oracle_frame(qid, docnos))['query_dime'][0]


@pytest.mark.filterwarnings('ignore:OracleDime')
def test_padding_labels_as_many_random_unjudged_candidates_0_as_there_are_judged():
    docnos = ['r1', 'u0', 'u1', 'r2', 'u2', 'u3', 'u4', 'u5']
    with pytest.warns(UserWarning, match=r"1 query \('a'\) had relevant but no non-relevant judged candidate"):
        out = OracleDime(qrels=ALL_RELEVANT, pad_negatives=True).transform(oracle_frame('a', docnos))
    assert out['query_padded'].tolist() == [2] * len(docnos)
    # the result is the plain oracle with exactly one pair of unjudged candidates judged non-relevant
    matches = [pair for pair in itertools.combinations(UNJUDGED, 2)
               if np.allclose(out['query_dime'][0], plain_oracle('a', docnos, pd.concat(
                   [ALL_RELEVANT, pd.DataFrame({'qid': 'a', 'docno': list(pair), 'label': 0})])), atol=1e-6)]
    assert len(matches) == 1
    # the same draw whatever the row order; another seed draws another pair
    reordered = OracleDime(qrels=ALL_RELEVANT, pad_negatives=True).transform(oracle_frame('a', docnos[::-1]))
    assert_vec(reordered['query_dime'][0], out['query_dime'][0])
    others = {tuple(OracleDime(qrels=ALL_RELEVANT, pad_negatives=True, seed=s).transform(
        oracle_frame('a', docnos))['query_dime'][0].round(5)) for s in range(1, 6)}
    assert len(others | {tuple(out['query_dime'][0].round(5))}) > 1


def test_padding_leaves_queries_with_a_non_relevant_judgment_alone():
    judged = pd.concat([ALL_RELEVANT.assign(qid='b'), pd.DataFrame({'qid': ['b'], 'docno': ['n1'], 'label': [0]})])
    docnos = ['r1', 'r2', 'n1', 'u0', 'u1']
    out = OracleDime(qrels=judged, pad_negatives=True).transform(oracle_frame('b', docnos))
    assert out['query_padded'].tolist() == [0] * 5
    assert_vec(out['query_dime'][0], plain_oracle('b', docnos, judged))


def test_padding_needs_a_relevant_judgment_and_unjudged_candidates():
    only_zero = pd.DataFrame({'qid': 'c', 'docno': ['n1'], 'label': [0]})
    with pytest.warns(UserWarning, match='using magnitude importance'):
        out = OracleDime(qrels=only_zero, pad_negatives=True).transform(oracle_frame('c', ['n1', 'u0', 'u1']))
    assert out['query_padded'].tolist() == [0, 0, 0]
    one_label = ALL_RELEVANT.assign(label=1)
    with pytest.warns(UserWarning, match='using magnitude importance'):  # relevant, but nothing to pad with
        out = OracleDime(qrels=one_label, pad_negatives=True).transform(oracle_frame('a', ['r1', 'r2']))
    assert out['query_padded'].tolist() == [0, 0]
    assert_vec(out['query_dime'][0], np.square(Q))


def test_one_judged_relevant_candidate_is_padded_with_one():
    judged = pd.DataFrame({'qid': 'd', 'docno': ['r1'], 'label': [1]})
    with pytest.warns(UserWarning, match='padded'):
        out = OracleDime(qrels=judged, pad_negatives=True).transform(oracle_frame('d', ['r1', 'u0', 'u1', 'u2']))
    assert out['query_padded'][0] == 1
    assert np.isfinite(out['query_dime'][0]).all() and not np.allclose(out['query_dime'][0], np.square(Q))


def test_padding_option_columns_and_config():
    assert 'query_padded' not in OracleDime(qrels=ALL_RELEVANT).transform(oracle_frame('a', ['r1', 'r2'])).columns
    empty = OracleDime(qrels=ALL_RELEVANT, pad_negatives=True).transform(oracle_frame('a', ['r1']).iloc[:0])
    assert list(empty.columns)[-2:] == ['query_dime', 'query_padded']
    with pytest.warns(UserWarning):
        one_row = OracleDime(qrels=ALL_RELEVANT, pad_negatives=True, keep_ranking=False).transform(
            oracle_frame('a', ['r1', 'r2', 'u0', 'u1']))
    assert len(one_row) == 1 and one_row['query_padded'][0] == 2
    with pytest.raises(ValueError, match='^OracleDime: pad_negatives must be True or False'):
        OracleDime(qrels=ALL_RELEVANT, pad_negatives=1)
    with pytest.raises(ValueError, match='^OracleDime: seed must be an integer >= 0'):
        OracleDime(qrels=ALL_RELEVANT, seed=-2)
    assert OracleDime(qrels=ALL_RELEVANT, pad_negatives=True) != OracleDime(qrels=ALL_RELEVANT)
    assert repr(OracleDime(qrels=ALL_RELEVANT, pad_negatives=True, seed=3)) == \
        'OracleDime(qrels=<DataFrame of 2 rows>, pad_negatives=True, seed=3)'


def test_variants_compose_with_a_threshold():
    out = (ActiveFeedbackDime(qrels=qrels(x3=1)) >> TopK(count=1)).transform(candidates())
    assert_vec(out['query_vec'][0], [0, 0, 0, 4])  # u = [0, 0, 6, 8]


QRELS = pd.DataFrame({'qid': ['1'], 'docno': ['a'], 'label': [1]})

TestScoreMassInspect = pt.testing.transformer_test_class(lambda: ScoreMass())


TestLlmEclipseDimeInspect = pt.testing.transformer_test_class(lambda: LlmEclipseDime(encoder=FakeEncoder()))


TestActiveFeedbackDimeInspect = pt.testing.transformer_test_class(lambda: ActiveFeedbackDime(qrels=QRELS))


TestPaddedOracleDimeInspect = pt.testing.transformer_test_class(lambda: OracleDime(qrels=QRELS, pad_negatives=True))
