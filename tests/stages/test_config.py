"""Configuration of every stage (_config, _checks): invalid arguments fail at construction naming the stage, repr,
equality and hash, schematic labels, compile() in pipelines, PyTerrier's own transformer checks; the hub-offline
rule and what importing the package loads."""
import subprocess
import sys

import numpy as np
import pandas as pd
import pyterrier as pt
import pytest
from frames import FakeEncoder, flatten

from pyterrier_rdime import (
    EclipseDime,
    KernelDime,
    LlmAnswers,
    LlmDime,
    LlmGenerator,
    MagnitudeDime,
    OracleDime,
    PrfDime,
    Rdime,
    SwcDime,
    TopK,
    VectorScorer,
    _config,
    maths,
)
from pyterrier_rdime.dime import FeedbackCutoff
from pyterrier_rdime.experiment import encoders


@pytest.mark.parametrize('make', [
    lambda: TopK(fraction=0), lambda: TopK(fraction=1.5), lambda: TopK(fraction=300), lambda: TopK(fraction=0.0),
    lambda: TopK(fraction=-0.5), lambda: TopK(fraction=True), lambda: TopK(fraction='0.5'),
    lambda: TopK(fraction=float('nan')), lambda: TopK(count=0), lambda: TopK(count=-1), lambda: TopK(count=0.5),
    lambda: TopK(count=3.0), lambda: TopK(count=True), lambda: TopK(fraction=0.5, count=3),
    lambda: PrfDime(keep_ranking=1), lambda: MagnitudeDime(keep_ranking='no'),
    lambda: LlmAnswers(answers=None), lambda: LlmAnswers(answers=[('1', 'a')]), lambda: LlmAnswers(answers={1: 'a'}),
    lambda: LlmAnswers(answers={'1': 3}),
    lambda: PrfDime(num_docs=0), lambda: SwcDime(num_docs=0), lambda: KernelDime(num_docs=-1),
    lambda: KernelDime(num_docs=2.5), lambda: PrfDime(num_docs=True),
    lambda: SwcDime(tau=0), lambda: SwcDime(tau=-1), lambda: KernelDime(tau=float('nan')),
    lambda: KernelDime(tau=float('inf')),
    lambda: KernelDime(kernel='cosine'), lambda: KernelDime(kernel=None),
    lambda: Rdime(fallback='zero'), lambda: Rdime(fallback=None),
    lambda: EclipseDime(num_pos=0), lambda: EclipseDime(num_neg=0), lambda: EclipseDime(beta=-0.5),
    lambda: EclipseDime(alpha=float('nan')),
    lambda: LlmAnswers(answers={}, missing='ignore'), lambda: LlmDime(encoder=object()),
    lambda: OracleDime(qrels=pd.DataFrame({'qid': ['1'], 'docno': ['a']})),
])
def test_invalid_parameters_fail_at_construction(make):
    with pytest.raises(ValueError):
        make()


@pytest.mark.parametrize('make, message', [
    (lambda: TopK(fraction=300), r"^TopK: fraction must be a fraction in \(0, 1\], got 300; .*use count=\.\.\."),
    (lambda: TopK(count=0.5), r"^TopK: count must be an integer >= 1, got 0\.5; .*use fraction=\.\.\."),
    (lambda: TopK(fraction=0.5, count=3), r'^TopK: give fraction=.* or count=.*not both'),
    (lambda: KernelDime(num_docs=0), r'^KernelDime: num_docs must be an integer >= 1, got 0'),
    (lambda: KernelDime(kernel='cosine'), r"^KernelDime: kernel must be one of 'uniform', .*got 'cosine'; .*callable"),
    (lambda: EclipseDime(beta=-0.5), r'^EclipseDime: beta must be a non-negative number, got -0\.5'),
    (lambda: PrfDime(keep_ranking=1), r'^PrfDime: keep_ranking must be True or False, got 1'),
    (lambda: LlmAnswers(answers=None), r'^LlmAnswers: answers must be a mapping .*got NoneType; .*from_tsv'),
    (lambda: LlmAnswers(answers={1: 'a'}), r"^LlmAnswers: answers has the qid 1 \(int\), but qids are strings"),
    (lambda: Rdime(fallback='zero'), r"^Rdime: .*'zero'"),
])
def test_invalid_parameter_messages_name_the_stage_value_and_fix(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize('stage, text', [
    (PrfDime(), 'PrfDime()'), (PrfDime(num_docs=2), 'PrfDime()'), (PrfDime(num_docs=3), 'PrfDime(num_docs=3)'),
    (PrfDime(keep_ranking=False), 'PrfDime(keep_ranking=False)'),
    (SwcDime(), 'SwcDime()'), (SwcDime(tau=0.5), 'SwcDime(tau=0.5)'),
    (SwcDime(num_docs=5, tau=0.2), 'SwcDime(num_docs=5, tau=0.2)'),
    (KernelDime(), 'KernelDime()'), (KernelDime(kernel='rank', num_docs=5), "KernelDime(kernel='rank', num_docs=5)"),
    (MagnitudeDime(), 'MagnitudeDime()'), (LlmDime(), 'LlmDime()'),
    (LlmDime(encoder=FakeEncoder()), 'LlmDime(encoder=FakeEncoder())'),
    (EclipseDime(), 'EclipseDime()'), (EclipseDime(beta=0.25), 'EclipseDime(beta=0.25)'),
    (Rdime(), 'Rdime()'), (Rdime(fallback='top1'), "Rdime(fallback='top1')"),
    (TopK(), 'TopK(fraction=0.6)'), (TopK(fraction=0.4), 'TopK(fraction=0.4)'), (TopK(count=10), 'TopK(count=10)'),
    (VectorScorer(), 'VectorScorer()'),
])
def test_repr_lists_only_non_default_args(stage, text):
    assert repr(stage) == text


def test_repr_of_a_pipeline():
    assert repr(PrfDime() >> Rdime(fallback='top1') >> VectorScorer()) == \
        "(PrfDime() >> Rdime(fallback='top1') >> VectorScorer())"


def test_repr_is_short_with_real_sized_qrels():
    qrels = pd.DataFrame({'qid': [str(i // 10) for i in range(1000)], 'docno': [f'd{i}' for i in range(1000)],
                          'label': [i % 3 for i in range(1000)]})
    text = repr(OracleDime(qrels=qrels))
    assert '\n' not in text and len(text) <= 120, text


def test_repr_is_short_with_real_sized_answers():
    answers = {str(i): 'A generated answer of a few sentences about the query. ' * 4 for i in range(43)}
    text = repr(LlmAnswers(answers=answers))
    assert '\n' not in text and len(text) <= 120, text[:300]


def _kernel(query_vecs, doc_vecs):
    return np.ones(doc_vecs.shape[:2])


QRELS = pd.DataFrame({'qid': ['1'], 'docno': ['a'], 'label': [1]})


ANSWERS = {'1': 'an answer'}


ENCODER = FakeEncoder()


@pytest.mark.parametrize('a, b', [
    (PrfDime(), PrfDime(num_docs=2, keep_ranking=True)),
    (SwcDime(), SwcDime(num_docs=10, tau=0.1)),
    (KernelDime(kernel='softmax', tau=0.3), KernelDime(kernel='softmax', tau=0.3)),
    (KernelDime(kernel=_kernel), KernelDime(kernel=_kernel)),
    (MagnitudeDime(), MagnitudeDime(keep_ranking=True)),
    (LlmDime(encoder=ENCODER), LlmDime(encoder=ENCODER)),
    (EclipseDime(), EclipseDime(num_pos=2, num_neg=5, alpha=1.0, beta=0.5)),
    (OracleDime(qrels=QRELS), OracleDime(qrels=QRELS)),
    (Rdime(), Rdime(fallback='full')),
    (TopK(), TopK(fraction=0.6)),
    (TopK(fraction=1), TopK(fraction=1.0)),
    (TopK(count=5), TopK(count=np.int64(5))),
    (VectorScorer(), VectorScorer()),
    (LlmAnswers(answers=ANSWERS), LlmAnswers(answers=ANSWERS, missing='fallback')),
    (PrfDime() >> Rdime() >> VectorScorer(), PrfDime(num_docs=2) >> Rdime(fallback='full') >> VectorScorer()),
])
def test_equal_configurations_are_equal_and_hash_equal(a, b):
    assert a is not b
    assert a == b and not (a != b)
    assert hash(a) == hash(b)
    assert len({a, b}) == 1


@pytest.mark.parametrize('a, b', [
    (PrfDime(), PrfDime(num_docs=3)),
    (PrfDime(), PrfDime(keep_ranking=False)),
    (PrfDime(), KernelDime()),
    (PrfDime(), SwcDime()),
    (SwcDime(), SwcDime(tau=0.2)),
    (KernelDime(kernel='rank'), KernelDime(kernel='rbf')),
    (KernelDime(kernel=_kernel), KernelDime(kernel=lambda q, d: np.ones(d.shape[:2]))),
    (LlmDime(), LlmDime(encoder=ENCODER)),
    (EclipseDime(), EclipseDime(beta=0.25)),
    (OracleDime(qrels=QRELS), OracleDime(qrels=QRELS.assign(label=[0]))),
    (Rdime(), Rdime(fallback='top1')),
    (TopK(fraction=0.6), TopK(fraction=0.4)),
    (TopK(count=1), TopK(fraction=1.0)),  # one dimension vs all of them
    (Rdime(), TopK()),
    (MagnitudeDime(), MagnitudeDime(keep_ranking=False)),
    (LlmAnswers(answers=ANSWERS), LlmAnswers(answers=ANSWERS, missing='error')),
    (PrfDime() >> Rdime(), PrfDime() >> TopK()),
])
def test_different_configurations_differ(a, b):
    assert a != b and not (a == b)
    assert len({a, b}) == 2


def test_schematic_labels_are_short():
    stages = [PrfDime(), SwcDime(), KernelDime(), MagnitudeDime(), LlmDime(), EclipseDime(), OracleDime(qrels=QRELS),
              Rdime(), TopK(), VectorScorer(), LlmAnswers(answers=ANSWERS), FeedbackCutoff(num_docs=2)]
    for stage in stages:
        assert 0 < len(stage.schematic['label']) <= 20


def test_pipeline_compile_cuts_only_in_the_full_retrieval_setting():
    full = (PrfDime(keep_ranking=False) >> Rdime()).compile()
    assert FeedbackCutoff(num_docs=2) in flatten(full)
    rerank = (PrfDime() >> Rdime() >> VectorScorer()).compile()
    assert not any(isinstance(t, FeedbackCutoff) for t in flatten(rerank))
    eclipse = (EclipseDime(keep_ranking=False) >> Rdime()).compile()
    assert not any(isinstance(t, FeedbackCutoff) for t in flatten(eclipse))


TestPrfDimeInspect = pt.testing.transformer_test_class(lambda: PrfDime())


TestSwcDimeInspect = pt.testing.transformer_test_class(lambda: SwcDime())


TestKernelDimeInspect = pt.testing.transformer_test_class(lambda: KernelDime(kernel='rank', keep_ranking=False))


TestMagnitudeDimeInspect = pt.testing.transformer_test_class(lambda: MagnitudeDime())


TestLlmDimeInspect = pt.testing.transformer_test_class(lambda: LlmDime(encoder=FakeEncoder()))


TestEclipseDimeInspect = pt.testing.transformer_test_class(lambda: EclipseDime())


TestOracleDimeInspect = pt.testing.transformer_test_class(lambda: OracleDime(qrels=QRELS))


TestRdimeInspect = pt.testing.transformer_test_class(lambda: Rdime())


TestTopKInspect = pt.testing.transformer_test_class(lambda: TopK(count=3))


TestVectorScorerInspect = pt.testing.transformer_test_class(lambda: VectorScorer())


TestLlmAnswersInspect = pt.testing.transformer_test_class(lambda: LlmAnswers(answers=ANSWERS))


def test_verbose_is_not_part_of_equality_or_the_hash():
    quiet, loud = LlmGenerator(cache=False, verbose=False), LlmGenerator(cache=False)
    assert quiet == loud and hash(quiet) == hash(loud)
    assert repr(quiet) == 'LlmGenerator(cache=False, verbose=False)'  # but it shows, like every non-default
    assert LlmGenerator(cache=False, max_new_tokens=3) != loud


@pytest.mark.parametrize('kwargs', [{'fraction': 2}, {'count': 0}, {'fraction': 0.5, 'count': 2}])
def test_topk_and_topk_count_share_one_check(kwargs):
    with pytest.raises(ValueError) as stage:
        TopK(**kwargs)
    with pytest.raises(ValueError) as function:
        maths.topk_count(4, **kwargs)
    assert str(stage.value).startswith('TopK: ')
    assert str(stage.value).removeprefix('TopK: ') == str(function.value).removeprefix('topk_count: ')


@pytest.mark.parametrize('flag, reachable, offline', [
    ('1', True, True), ('YES', True, True), ('true', True, True), ('on', True, True),  # as huggingface_hub reads it
    ('0', True, False), ('no', True, False), ('', True, False),
    ('0', False, True),  # not set, but the hub does not answer
])
def test_one_rule_decides_whether_the_hub_is_offline(monkeypatch, flag, reachable, offline):
    monkeypatch.setenv('HF_HUB_OFFLINE', flag)
    monkeypatch.delenv('TRANSFORMERS_OFFLINE', raising=False)
    monkeypatch.setattr(_config, '_hub_reachable', lambda: reachable)
    assert _config.hub_offline() is offline
    assert encoders.hub_offline is _config.hub_offline  # the runner uses the same rule


def test_importing_the_package_loads_nothing_heavy():
    code = ('import sys, pyterrier_rdime; '
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'numba', 'scipy', 'torch', 'transformers', "
            "'sentence_transformers', 'faiss', 'pyterrier_dr', 'sklearn'}))")
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == '[]', out.stdout + out.stderr
