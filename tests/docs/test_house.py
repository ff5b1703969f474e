"""The house rules the code can check: experiment/'s modules import one another without a circle, in the order its
docstring lists them, and the benchmarks hold no path of one machine."""
import ast
import re
from pathlib import Path

import pyterrier_rdime.experiment as experiment

ROOT = Path(__file__).resolve().parents[2]


def _relative_imports(path: Path) -> set:
    """The sibling modules that ``path`` imports (``from .x import`` and ``from . import x``, anywhere in it)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding='utf-8'))):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found |= {node.module.split('.')[0]} if node.module else {alias.name for alias in node.names}
    return found


def test_experiment_modules_import_only_those_listed_before_them():
    folder = Path(experiment.__file__).parent
    modules = sorted(p.stem for p in folder.glob('*.py') if p.stem != '__init__')
    listed = re.findall(r'``(\w+)``', experiment.__doc__.split('They stay')[0])
    order = [name for name in dict.fromkeys(listed) if name in modules]
    assert sorted(order) == modules  # the docstring places every module
    for module in order:
        imported = _relative_imports(folder / f'{module}.py')
        later = [m for m in imported if m in order and order.index(m) >= order.index(module)]
        assert not later, f'{module} imports {later}, listed after it'


def test_no_machine_path_in_the_benchmarks():
    for script in (ROOT / 'benchmarks').glob('*.py'):
        text = script.read_text(encoding='utf-8')
        assert not re.search(r'/(work|root|home|tmp)/', text), script.name
