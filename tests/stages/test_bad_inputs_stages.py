"""Bad inputs and faults for the library stages, as one table: each row is an input and the error or behaviour it
must give. Errors name the stage, the offending column and row (qid/docno) or file, and the fix; a legal input
never silently becomes "no signal". Then SIGKILL faults of LlmGenerator's answer cache."""
import multiprocessing
import os
import re
import signal
import sqlite3
import warnings
from typing import Callable, NamedTuple, Optional

import numpy as np
import pandas as pd
import pytest
from frames import D1, D2, Q, queries, results, vec
from pruned_data import flex_index

from pyterrier_rdime import (
    EclipseDime,
    KernelDime,
    LlmAnswers,
    LlmDime,
    LlmGenerator,
    MagnitudeDime,
    OracleDime,
    PrfDime,
    PrunedRetriever,
    Rdime,
    SwcDime,
    TopK,
    VectorScorer,
    read_answers_tsv,
)
from pyterrier_rdime.dime import FeedbackCutoff
from pyterrier_rdime.llm import CACHE_FILE

TINY = 1e-30  # legal float32 vectors whose products (1e-60) are below float32's range
QRELS = pd.DataFrame({'qid': ['q1', 'q1'], 'docno': ['d1', 'd2'], 'label': [1, 0]})
# the worked example 3 of the paper: PRF over d1 and d2 gives u = [0.95, 2.1, 5.7, 6.2], eps2 = 3.7625, kept {2, 3};
# the pruned query [0, 0, 3, 4] scores d1 3 * 2.8 + 4 * 0.1 = 8.8 and d2 3 + 12 = 15
U_EX3 = np.array([0.95, 2.1, 5.7, 6.2])


def example(scale: float = 1.0, **columns) -> pd.DataFrame:
    """d1 first in the input and by first-stage score; d2 wins after pruning."""
    frame = results([('q1', np.multiply(Q, scale), 'd1', np.multiply(D1, scale), 2.0),
                     ('q1', np.multiply(Q, scale), 'd2', np.multiply(D2, scale), 1.0)])
    return frame.assign(**columns)


def scores_column(*values) -> dict:
    return {'score': pd.Series(values, dtype=object)}


class Case(NamedTuple):
    name: str
    run: Callable[[], object]
    error: Optional[type] = None  # the exception, or None: the call succeeds and ``check`` holds
    message: str = ''  # a regex the message must start with
    check: Optional[Callable[[object], None]] = None


def tiny_rdime(out):
    row = out.iloc[0]
    assert row['query_dime'].dtype == np.float64  # float32 would have flushed it to 0
    np.testing.assert_allclose(row['query_dime'], U_EX3 * TINY ** 2, rtol=1e-6)
    assert row['query_eps2'] == pytest.approx(3.7625 * TINY ** 2, rel=1e-6)
    assert not row['query_fallback'] and row['query_kept'] == 2
    assert out['docno'].tolist() == ['d2', 'd1']
    np.testing.assert_allclose(out['score'], [15 * TINY ** 2, 8.8 * TINY ** 2], rtol=1e-6)


def tiny_topk(out):
    assert out['docno'].tolist() == ['d2', 'd1']
    np.testing.assert_allclose(out['score'], [15 * TINY ** 2, 8.8 * TINY ** 2], rtol=1e-6)


def same_weights(weights):
    def check(out):
        expected = np.multiply(Q, weights[0] * np.array(D1) + weights[1] * np.array(D2))
        np.testing.assert_allclose(out['query_dime'].iloc[0], expected, rtol=1e-6)
    return check


def with_warnings(run: Callable[[], object]) -> Callable[[], tuple]:
    """``run`` made to return ``(its result, the messages of the warnings it gave)``."""
    def recorded():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            out = run()
        return out, [str(w.message) for w in caught]
    return recorded


def equal(column: str, expected: list, warned: Optional[list] = None) -> Callable[[object], None]:
    """A check that the output's ``column`` is ``expected`` (and, for a ``with_warnings`` result, its warnings are
    ``warned``)."""
    def check(result):
        out, messages = result if warned is not None else (result, None)
        assert out[column].tolist() == expected
        assert messages == warned
    return check


def assert_equal(actual, expected):
    assert actual == expected


def no_answers_warned(result):
    out, messages = result
    assert out['query_answer'].tolist() == [None, None]
    assert len(messages) == 1 and re.match(r"LlmAnswers\(answers=<dict of 2 items>\): no query of the input has an "
                                           r"answer \(2 qid\(s\), e.g. '7'; the answers have 2 qid\(s\), e.g. '1'\): "
                                           'every query_answer is None; check that the answers are for these queries',
                                           messages[0]), messages


def file_with(tmp, content: bytes, name='answers.tsv'):
    path = tmp / name
    path.write_bytes(content)
    return path


def cases(tmp) -> list:
    plain = tmp / 'plain-file'
    plain.write_text('not a folder')
    corrupt = tmp / 'corrupt'
    corrupt.mkdir()
    (corrupt / CACHE_FILE).write_bytes(b'these bytes are not an SQLite database\n' * 100)
    foreign = tmp / 'foreign'
    foreign.mkdir()
    with sqlite3.connect(foreign / CACHE_FILE) as db:
        db.execute('CREATE TABLE answers (qid TEXT, text TEXT)')
    folder_file = tmp / 'folder-file'
    (folder_file / CACHE_FILE).mkdir(parents=True)
    eye = np.eye(4, dtype=np.float32)  # four documents: docid i scores q_i
    one_answer = LlmAnswers(answers={'1': 'one', '2': 'two'})
    float_qid = (r"LlmAnswers\(answers=<dict of \d items>\): qid '{}' of the input has no entry in the answers, "
                 r"but the answers have qid '{}': the same integer qid, written as a float in the {} "
                 r"\(pandas reads .*\); read the qids as strings on both sides, "
                 r"e\.g\. pd\.read_csv\(\.\.\., dtype=\{{'qid': str\}}\)")
    name_score = r"column 'score' holds 'high' \(str\) at qid='q1', docno='d2', not a number; .*pd\.to_numeric"
    kernel_stage = r'KernelDime\(kernel=<function .*>\): '
    return [
        # --- LlmGenerator's answer cache: checked at construction, before anything is generated
        Case('cache under a regular file', lambda: LlmGenerator(cache=plain / 'answers'), OSError,
             rf"LlmGenerator: cannot create the answer cache folder {re.escape(str(plain / 'answers'))} .*pass "
             r'cache= a folder that can be created and written, or cache=False'),
        Case('cache is a regular file', lambda: LlmGenerator(cache=plain), OSError,
             rf'LlmGenerator: cannot create the answer cache folder {re.escape(str(plain))} '),
        Case('corrupt cache file', lambda: LlmGenerator(cache=corrupt), OSError,
             rf'LlmGenerator: the answer cache {re.escape(str(corrupt / CACHE_FILE))} cannot be used '
             r'\(DatabaseError: file is not a database\); .*delete it .*or pass another cache= folder'),
        Case('cache file is a folder', lambda: LlmGenerator(cache=folder_file), OSError,
             rf'LlmGenerator: {re.escape(str(folder_file / CACHE_FILE))} is a folder \(or another non-file\), not '
             'the answer cache file; move it away or pass another cache= folder'),
        Case('cache file of another program', lambda: LlmGenerator(cache=foreign), ValueError,
             rf'LlmGenerator: {re.escape(str(foreign / CACHE_FILE))} holds a table "answers" with columns '
             r"\['qid', 'text'\], not an answer cache of LlmGenerator; move that file away .*"),
        # --- legal but tiny vectors: the signal survives (float64 where float32 would flush it to 0)
        Case('vectors ~1e-30 through PRF, RDIME and the scorer',
             lambda: (PrfDime() >> Rdime() >> VectorScorer())(example(TINY)), check=tiny_rdime),
        Case('vectors ~1e-30 through PRF, Top-k and the scorer',
             lambda: (PrfDime() >> TopK(count=2) >> VectorScorer())(example(TINY)), check=tiny_topk),
        Case('scores ~1e-60 are ranked by score, not input order',
             lambda: VectorScorer()(example(TINY, query_vec=[vec(np.multiply([0, 0, 3, 4], TINY))] * 2)),
             check=tiny_topk),
        # --- callable kernels: any finite scale works; no similarity at all is an error naming the qid
        Case('callable kernel of 1e308 (its sum overflows)',
             lambda: KernelDime(kernel=lambda q, d: np.full(d.shape[:2], 1e308))(example()),
             check=same_weights([0.5, 0.5])),
        Case('callable kernel of 1e308 and 0.5e308',
             lambda: KernelDime(kernel=lambda q, d: np.tile([1e308, 0.5e308], (len(q), 1)))(example()),
             check=same_weights([2 / 3, 1 / 3])),
        Case('callable kernel of all zeros',
             lambda: KernelDime(kernel=lambda q, d: np.zeros(d.shape[:2]))(example()), ValueError,
             kernel_stage + r"the kernel gives every feedback document of qid='q1' similarity 0, .*positive "
                            r'similarity'),
        Case('callable kernel of inf',
             lambda: KernelDime(kernel=lambda q, d: np.full(d.shape[:2], np.inf))(example()), ValueError,
             kernel_stage + r'kernel .* returned negative or non-finite similarities; kernels must be >= 0'),
        Case('callable kernel of the wrong shape',
             lambda: KernelDime(kernel=lambda q, d: np.ones(3))(example()), ValueError,
             kernel_stage + r'kernel .* returned shape \(3,\); expected \(n_queries, n_docs\) = \(1, 2\)'),
        *[Case(f'{kernel} kernel with a tau so small that it overflows',
               lambda kernel=kernel: KernelDime(kernel=kernel, tau=1e-310)(example()), ValueError,
               rf"KernelDime\(kernel='{kernel}', tau=1e-310\): kernel_weights: the '{kernel}' kernel overflows with "
               r'tau=1e-310 .*; use a larger tau')
          for kernel in ('softmax', 'rbf')],
        Case('sigmoid kernel with a tiny tau: its limit, every positive similarity weighs 1',
             lambda: KernelDime(kernel='sigmoid', tau=1e-310)(example()), check=same_weights([0.5, 0.5])),
        # --- non-numeric scores name the stage, the column and the row
        *[Case(f'text score in {type(stage).__name__}',
               lambda stage=stage: stage(example(**scores_column(2.0, 'high'))), ValueError,
               rf'{re.escape(repr(stage))}: {name_score}')
          for stage in (PrfDime(), SwcDime(), KernelDime(kernel='rank'), EclipseDime(), OracleDime(qrels=QRELS),
                        FeedbackCutoff(num_docs=1))],
        Case('list in the score column', lambda: PrfDime()(example(**scores_column([1.0], 2.0))), ValueError,
             r"PrfDime\(\): column 'score' holds \[1\.0\] \(list\) at qid='q1', docno='d1', not a number"),
        Case('missing score', lambda: PrfDime()(example(**scores_column(2.0, None))), ValueError,
             r"PrfDime\(\): column 'score' is NaN at qid='q1', docno='d2' \(1 row\(s\)\); .*drop those rows"),
        Case('numeric text scores are numbers', lambda: PrfDime()(example(**scores_column('2.0', '1'))),
             check=lambda out: np.testing.assert_allclose(out['query_dime'].iloc[0], U_EX3, rtol=1e-6)),
        # --- OracleDime's qrels: checked at construction
        Case('text label in qrels', lambda: OracleDime(qrels=QRELS.assign(label=['rel', 0])), ValueError,
             r"OracleDime: column 'label' holds 'rel' \(str\) at qid='q1', docno='d1', not a number; .*to_numeric"),
        Case('NaN label in qrels', lambda: OracleDime(qrels=QRELS.assign(label=[np.nan, 0])), ValueError,
             r"OracleDime: qrels label is nan at qid='q1', docno='d1'; every judgment needs a finite label: .*"),
        Case('two labels for one judgment',
             lambda: OracleDime(qrels=pd.concat([QRELS, QRELS.assign(label=[0, 0])])), ValueError,
             r"OracleDime: qrels judge qid='q1', docno='d1' twice with different labels \[0\.0, 1\.0\]; .*"),
        Case('a repeated identical judgment is fine', lambda: OracleDime(qrels=pd.concat([QRELS, QRELS])),
             check=lambda stage: None),
        # --- found probing the same way
        Case('Eclipse with alpha = beta = 0', lambda: EclipseDime(alpha=0, beta=0), ValueError,
             r'EclipseDime: alpha and beta are both 0, so every importance would be 0 \(no signal\); .*'),
        Case('text in query_dime', lambda: Rdime()(example(query_dime=['a', 'b'])), ValueError,
             r"Rdime\(\): column 'query_dime' at qid='q1' holds str of shape \(\), not a 1-D vector; .*"),
        Case('text in query_vec', lambda: MagnitudeDime()(queries([('1', Q)]).assign(query_vec=[np.array(list('ab'))])),
             ValueError, r"MagnitudeDime\(\): column 'query_vec' at qid='1' holds <U1 values, not real numbers; .*"),
        Case('text in query_answer_vec',
             lambda: LlmDime()(queries([('1', Q)], query_answer_vec=[np.array(list('abcd'))])), ValueError,
             r"LlmDime\(\): column 'query_answer_vec' at qid='1' holds <U1 values, not real numbers; .*"),
        Case('missing doc_vec in the scorer', lambda: VectorScorer()(example(doc_vec=[None, vec(D2)])), ValueError,
             r"VectorScorer\(\): column 'doc_vec' at docno='d1' holds None, not a 1-D vector; .*"),
        *[Case(f'query_vec differs between the rows of a query in {type(stage).__name__}',
               lambda stage=stage: stage(example(query_vec=[vec(Q), vec(D1)], query_dime=[vec(Q)] * 2)), ValueError,
               rf"{re.escape(repr(stage))}: column 'query_vec' differs between rows of one query \(qid='q1', "
               r"docno='d1' and qid='q1', docno='d2'\), but a query has one query_vec; .*")
          for stage in (PrfDime(), Rdime(), TopK(), VectorScorer())],
        Case('query_dime differs between the rows of a query', lambda: Rdime()(example(query_dime=[vec(Q), vec(D1)])),
             ValueError, r"Rdime\(\): column 'query_dime' differs between rows of one query .*"),
        Case('equal vectors in separate arrays are one query vector',  # scores Q.D2 and Q.D1
             lambda: VectorScorer()(example(query_vec=[vec(Q), vec(Q)])),
             check=lambda out: np.testing.assert_allclose(out['score'], [1 + 3 + 12, 0.9 + 4.2 + 8.4 + 0.4])),
        Case('answers file with a space in a qid', lambda: read_answers_tsv(file_with(tmp, b'q1\ta\nq 2\tb\n')),
             ValueError, r".*answers\.tsv:2: qid 'q 2' is empty or holds whitespace, .*write the qid without spaces"),
        # --- PrunedRetriever: flags are bools; a docno names one document (else a ranking holds it twice)
        *[Case(f'PrunedRetriever {option}={value!r}', lambda option=option, value=value: PrunedRetriever(
               index=eye, **{option: value}), ValueError,
               rf'PrunedRetriever: {option} must be True or False, got {re.escape(repr(value))}$')
          for option, value in (('drop_query_vec', 'no'), ('drop_query_vec', 1), ('verbose', 'no'),
                                ('verbose', None))],
        Case('PrunedRetriever numpy bool flags are bools',
             lambda: PrunedRetriever(index=eye, drop_query_vec=np.bool_(True))(queries([('1', Q)])),
             check=lambda out: assert_equal(list(out.columns), ['qid', 'query', 'docno', 'docid', 'score', 'rank'])),
        Case('PrunedRetriever array index with a repeated docno',
             lambda: PrunedRetriever(index=eye, docnos=['a', 'b', 'c', 'b'])(queries([('1', Q)])), ValueError,
             r"PrunedRetriever: docno 'b' names more than one document of the array index \(docids 1 and 3\), so a "
             'ranking could hold it twice; give each row its own docno'),
        Case('PrunedRetriever FlexIndex with a repeated docno',
             lambda: PrunedRetriever(index=flex_index(tmp / 'dup.flex', eye, docnos=['a', 'b', 'a', 'c']))(
                 queries([('1', Q)])), ValueError,
             rf"PrunedRetriever: docno 'a' names more than one document of {re.escape(str(tmp / 'dup.flex'))} "
             r"\(docids 0 and 2\), so a ranking could hold it twice; index each document once .*indexer\(mode="
             "'overwrite'\\)"),
        Case('PrunedRetriever array index with unique docnos ranks each once',
             lambda: PrunedRetriever(index=eye, docnos=['a', 'b', 'c', 'd'], num_results=2)(queries([('1', Q)])),
             check=equal('docno', ['d', 'c'])),
        # --- LlmAnswers matches qids as strings; an integer qid written as a float on one side is an error
        Case("LlmAnswers with input qids '1.0'",
             lambda: one_answer(queries([('1.0', Q), ('2.0', Q)])), ValueError, float_qid.format('1.0', '1', 'input')),
        Case('LlmAnswers with float input qids 1.0 (as pandas reads them)',
             lambda: one_answer(queries([(1.0, Q), (2.0, Q)])), ValueError, float_qid.format('1.0', '1', 'input')),
        Case("LlmAnswers with answers for '1.0'",
             lambda: LlmAnswers(answers={'1.0': 'one'})(queries([('1', Q)])), ValueError,
             float_qid.format('1', '1.0', 'answers')),
        Case('LlmAnswers where no query has an answer warns',
             with_warnings(lambda: one_answer(queries([('7', Q), ('8', Q)]))), check=no_answers_warned),
        Case('LlmAnswers where some query has an answer is silent',
             with_warnings(lambda: one_answer(queries([('7', Q), ('2', Q)]))),
             check=equal('query_answer', [None, 'two'], warned=[])),
        Case('answers file with a qid twice', lambda: LlmAnswers.from_tsv(file_with(tmp, b'q1\ta\n\nq1\tb\n')),
             ValueError, r".*answers\.tsv:3: qid 'q1' is also on line 1; .*remove the repeated line"),
    ]


@pytest.fixture(scope='module')
def table(tmp_path_factory):
    return {case.name: case for case in cases(tmp_path_factory.mktemp('bad-inputs'))}


def test_the_table(table, subtests):
    for case in table.values():
        with subtests.test(case.name):
            if case.error is not None:
                with pytest.raises(case.error) as caught:
                    case.run()
                assert re.match(case.message, str(caught.value), flags=re.DOTALL), str(caught.value)
            else:
                case.check(case.run())


# ---------------------------------------------------------------------------------------------------------------
# SIGKILL faults of the answer cache: a killed run leaves only whole batches; the next run completes correctly
# ---------------------------------------------------------------------------------------------------------------

QUERIES = [f'query {i}' for i in range(6)]  # three batches of two


def fake_answer(query: str) -> str:
    return f'answer to {query}'


def _child(folder: str, kill_on: str, at: int) -> None:
    """Generate QUERIES with a fake model, SIGKILLing this process at the ``at``-th model call ('generate') or just
    as the ``at``-th batch's transaction commits ('commit': the rows are written, the commit not yet done)."""
    calls = []

    def generate(self, batch):
        calls.append(batch)
        if kill_on == 'generate' and len(calls) == at:
            os.kill(os.getpid(), signal.SIGKILL)
        return [fake_answer(q) for q in batch]

    real_connect, commits = sqlite3.connect, []

    def connect(*args, **kwargs):
        db = real_connect(*args, **kwargs)

        def trace(sql):
            if sql.strip().upper().startswith('COMMIT'):
                commits.append(sql)
                if kill_on == 'commit' and len(commits) == at:
                    os.kill(os.getpid(), signal.SIGKILL)
        db.set_trace_callback(trace)
        return db

    sqlite3.connect = connect  # in the child only
    LlmGenerator._generate = generate
    LlmGenerator(cache=folder, batch_size=2).generate(QUERIES)


@pytest.mark.parametrize('kill_on, at, cached', [
    ('generate', 2, 2),  # killed while the second batch is generated: the first batch is cached
    ('commit', 2, 2),  # killed inside the second batch's write: rolled back, the first batch stays
    ('commit', 1, 0),  # killed inside the first write: nothing cached
])
def test_a_killed_run_leaves_a_consistent_cache(tmp_path, monkeypatch, kill_on, at, cached):
    child = multiprocessing.get_context('fork').Process(target=_child, args=(str(tmp_path), kill_on, at))
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGKILL
    with sqlite3.connect(tmp_path / CACHE_FILE) as db:  # opening rolls an interrupted write back
        assert db.execute('PRAGMA integrity_check').fetchone() == ('ok',)
        rows = dict(db.execute('SELECT query, answer FROM answers').fetchall())
    assert rows == {q: fake_answer(q) for q in QUERIES[:cached]}

    generated = []

    def generate(self, batch):
        generated.extend(batch)
        return [fake_answer(q) for q in batch]

    monkeypatch.setattr(LlmGenerator, '_generate', generate)
    answers = LlmGenerator(cache=tmp_path, batch_size=2).generate(QUERIES)
    assert answers == {q: fake_answer(q) for q in QUERIES}
    assert generated == QUERIES[cached:]  # only what the killed run had not stored
