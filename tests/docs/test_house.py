"""The house rules the code can check: the package's modules import one another without a circle, no docstring runs
over 25 lines (details belong in pt_docs), and the benchmarks hold no path of one machine."""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / 'pyterrier_rdime'
MAX_DOCSTRING_LINES = 25


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix('').parts
    return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def import_graph(root: Path) -> dict:
    """For each module of the package at ``root``, the package's modules it imports (anywhere in it, a function's
    lazy imports included): ``from .x import y`` counts as importing ``x.y`` where that is a module, else ``x``."""
    modules = {module_name(p, root): p for p in root.rglob('*.py')}

    def owner(name: str) -> str:
        while name not in modules and '.' in name:
            name = name.rsplit('.', 1)[0]
        return name if name in modules else ''

    graph = {}
    for name, path in modules.items():
        package = name if path.name == '__init__.py' else name.rsplit('.', 1)[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding='utf-8'))):
            if isinstance(node, ast.Import):
                found |= {owner(alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ''
                if node.level:
                    parts = package.split('.')[:len(package.split('.')) - node.level + 1]
                    base = '.'.join(parts + ([node.module] if node.module else []))
                found |= {owner(f'{base}.{alias.name}') or owner(base) for alias in node.names}
        graph[name] = found - {'', name}
    return graph


def circles(graph: dict) -> list:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle_in_the_package():
    graph = import_graph(PACKAGE)
    assert 'pyterrier_rdime.experiment.runner' in graph['pyterrier_rdime.experiment.grid']  # the imports were read
    assert circles(graph) == []


def test_the_circle_check_finds_a_circle(tmp_path):
    package = tmp_path / 'pkg'
    (package / 'sub').mkdir(parents=True)
    (package / '__init__.py').write_text('')
    (package / 'sub' / '__init__.py').write_text('')
    (package / 'a.py').write_text('from .sub import b\n')
    (package / 'sub' / 'b.py').write_text('def f():\n    from pkg import c\n')
    (package / 'c.py').write_text('import pkg.a\n')
    (package / 'd.py').write_text('from . import a\n')
    assert circles(import_graph(package)) == [['pkg.a', 'pkg.c', 'pkg.sub.b']]


def long_docstrings(root: Path, limit: int = MAX_DOCSTRING_LINES) -> list:
    """``file:line name (n lines)`` for each module, class or function docstring under ``root`` longer than
    ``limit`` lines."""
    found = []
    for path in sorted(root.rglob('*.py')):
        tree = ast.parse(path.read_text(encoding='utf-8'))
        for node in [tree, *ast.walk(tree)]:
            if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if ast.get_docstring(node) is None:
                continue
            doc = node.body[0]
            lines = doc.end_lineno - doc.lineno + 1
            if lines > limit:
                found.append(f'{path.relative_to(root.parent)}:{doc.lineno} {getattr(node, "name", "module")} '
                             f'({lines} lines)')
    return sorted(set(found))


def test_no_docstring_over_25_lines():
    """Docstrings say what a thing does, its columns and an example; design notes and measurements live in pt_docs."""
    assert long_docstrings(PACKAGE) == []


def test_the_docstring_check_counts_every_kind(tmp_path):
    body = '\n'.join(['x'] * 25)
    (tmp_path / 'pkg').mkdir()
    (tmp_path / 'pkg' / 'm.py').write_text(f'"""{body}\n"""\n\nclass C:\n    """one\n    two"""\n\n\n'
                                           f'def f():\n    """{body}\n    """\n')
    assert long_docstrings(tmp_path / 'pkg') == ['pkg/m.py:1 module (26 lines)', 'pkg/m.py:34 f (26 lines)']


def test_no_machine_path_in_the_benchmarks():
    for script in (ROOT / 'benchmarks').glob('*.py'):
        text = script.read_text(encoding='utf-8')
        assert not re.search(r'/(work|root|home|tmp)/', text), script.name
