"""Decide once, pass down: the modules of pyterrier_rdime.pruned import one another without a circle, and a call of
PrunedRetriever decides its plan once (planner.choose) and the path below carries it out without deciding again."""
import ast
from pathlib import Path

import numpy as np
import pytest
from pruned_data import K, make_corpus, query_frame

from pyterrier_rdime import PrunedRetriever
from pyterrier_rdime.pruned import compressed, dense, kept, planner
from pyterrier_rdime.pruned.planner import Choice, Plan

PRUNED = Path(kept.__file__).parent


def sibling_imports(path: Path) -> set:
    """The modules of the package that ``path`` imports, at the top or inside a function (``from . import x``,
    ``from .x import y``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found |= {node.module} if node.module else {alias.name for alias in node.names}
    return found


def test_the_modules_import_one_another_without_a_circle():
    graph = {path.stem: sibling_imports(path) for path in PRUNED.glob('*.py') if path.stem != '__init__'}
    assert graph['_numba'] <= {'dense'} and graph['planner'] <= {'dense'} and graph['dense'] == set()
    assert 'calibration' not in graph['planner'] and 'planner' not in graph['kept']
    done, visiting = set(), []

    def visit(module):
        assert module not in visiting, f'import circle: {" -> ".join(visiting + [module])}'
        if module in done or module not in graph:
            return
        visiting.append(module)
        for imported in graph[module]:
            visit(imported)
        visiting.pop()
        done.add(module)
    for module in graph:
        visit(module)


@pytest.fixture(scope='module')
def corpus():
    return make_corpus()


@pytest.mark.parametrize('path', ['dense', 'pruned', 'one pass', 'compressed', 'compressed one pass'])
def test_a_call_decides_once_and_the_path_carries_the_plan_out(corpus, monkeypatch, path):
    docs, query_vecs = corpus
    plans, calls = [], []
    monkeypatch.setattr(planner, 'choose', lambda q, **_: plans.append(len(q)) or Choice(path, 1, '', 'model'))
    for module, name in ((dense, 'search_dense'), (kept, 'search_pruned')):
        original = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _f=original, _n=name, **kw: calls.append((_n, kw)) or _f(*a, **kw))
    original_compressed = compressed.search_compressed

    def spy_compressed(*args, **kwargs):
        calls.append(('search_compressed', kwargs))
        return original_compressed(*args, **kwargs)
    monkeypatch.setattr('pyterrier_rdime.pruned.stage.search_compressed', spy_compressed)
    out = PrunedRetriever(index=docs, num_results=K, strategy='auto')(query_frame(query_vecs))
    assert plans == [len(query_vecs)] and len(calls) == 1 and len(out) == K * len(query_vecs)
    name, kwargs = calls[0]
    expected = {'dense': 'search_dense', 'pruned': 'search_pruned', 'one pass': 'search_pruned',
                'compressed': 'search_compressed', 'compressed one pass': 'search_compressed'}[path]
    assert name == expected
    if name != 'search_dense':
        assert kwargs['one_pass'] == (path in ('one pass', 'compressed one pass'))


def test_search_takes_a_given_plan(corpus, monkeypatch):
    docs, query_vecs = corpus
    retriever = PrunedRetriever(index=docs, num_results=K)
    monkeypatch.setattr(planner, 'choose', lambda *a, **kw: pytest.fail('decided again'))
    by_plan = {path: retriever.search(query_vecs, Plan(path)) for path in ('dense', 'pruned', 'one pass',
                                                                          'compressed', 'compressed one pass')}
    for path, (scores, docids) in by_plan.items():
        assert [d.tolist() for d in docids] == [d.tolist() for d in by_plan['dense'][1]], path
        np.testing.assert_allclose(np.concatenate(scores), np.concatenate(by_plan['dense'][0]), rtol=1e-5,
                                   atol=1e-5)
