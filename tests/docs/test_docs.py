"""The documentation pages in pyterrier_rdime/pt_docs, checked without PyTerrier's docs build: every page parses with
docutils without a warning, PyTerrier's own directives (``schematic``, ``related``, ``cite``, ``cite.dblp``: they live
in PyTerrier's docs tree, not in an installable package) are accepted, and every Python name a page points at
(``autoclass``, ``autofunction``, ``related``, ``:class:``, ``:func:``, ``:meth:``, ``:mod:``, ...) imports, every
``:doc:`` and toctree entry is a page; every name a Python code block uses is bound by the block, an earlier block of
its page or the index page's setup for the examples. Also: the clone address is written the same everywhere, and
nothing points outside the repository."""
import ast
import builtins
import configparser
import importlib
import io
import json
import re
from pathlib import Path

import pytest
from docutils import nodes
from docutils.core import publish_doctree
from docutils.parsers.rst import Directive, directives, roles
from docutils.parsers.rst.directives.body import CodeBlock

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / 'pyterrier_rdime' / 'pt_docs'
PAGES = sorted(DOCS.glob('*.rst'))


def resolve(name: str) -> object:
    """The object a dotted name points at: the longest importable module prefix, then attributes."""
    parts = name.lstrip('~').split('.')
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module('.'.join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(f'no module in {name!r} imports')


class _Checks:
    """What the directives and roles found wrong while one page was parsed."""
    problems: list = []


def _check_target(name: str, where: str, kind=None) -> None:
    try:
        obj = resolve(name)
    except (ImportError, AttributeError) as e:
        _Checks.problems.append(f'{where}: {name} does not import ({e})')
        return
    if kind is not None and not kind(obj):
        _Checks.problems.append(f'{where}: {name} is not a {kind.__doc__}')


def _isclass(obj) -> bool:
    """class"""
    return isinstance(obj, type)


def _isfunction(obj) -> bool:
    """function"""
    return callable(obj) and not isinstance(obj, type)


class NoOp(Directive):
    """PyTerrier's docs-only directives: arguments, options and content are accepted and dropped."""
    optional_arguments = 10
    final_argument_whitespace = True
    has_content = True
    option_spec = {'show_code': directives.flag, 'citation': directives.unchanged, 'link': directives.unchanged,
                   'input_columns': directives.unchanged, 'output_columns': directives.unchanged}

    def run(self):
        return []


def _importing(kind):
    class Importing(Directive):
        """sphinx.ext.autodoc's ``autoclass``/``autofunction``, reduced to: the target imports and is of its kind."""
        required_arguments = 1
        final_argument_whitespace = True
        has_content = True
        option_spec = {'members': directives.unchanged, 'undoc-members': directives.flag,
                       'inherited-members': directives.flag, 'special-members': directives.unchanged,
                       'exclude-members': directives.unchanged, 'show-inheritance': directives.flag}

        def run(self):
            source, line = self.state_machine.get_source_and_line(self.lineno)
            _check_target(self.arguments[0], f'{source}:{line}', kind)
            return []
    return Importing


class Related(NoOp):
    def run(self):
        source, line = self.state_machine.get_source_and_line(self.lineno)
        _check_target(self.arguments[0], f'{source}:{line}')
        return []


class TocTree(Directive):
    has_content = True
    option_spec = {'caption': directives.unchanged, 'maxdepth': directives.nonnegative_int, 'hidden': directives.flag}

    def run(self):
        source, line = self.state_machine.get_source_and_line(self.lineno)
        for entry in self.content:
            target = re.search(r'<([^>]+)>\s*$', entry)
            page = (target.group(1) if target else entry).strip()
            if page and not (DOCS / f'{page}.rst').is_file():
                _Checks.problems.append(f'{source}:{line}: toctree entry {page!r} has no {page}.rst in {DOCS.name}')
        return []


def _python_role(kind):
    def role(name, rawtext, text, lineno, inliner, options=None, content=None):
        target = re.search(r'<([^>]+)>$', text)
        source, line = inliner.reporter.get_source_and_line(lineno)
        _check_target(target.group(1) if target else text, f'{source}:{line}', kind)
        return [nodes.literal(rawtext, text)], []
    return role


def doc_role(name, rawtext, text, lineno, inliner, options=None, content=None):
    target = re.search(r'<([^>]+)>$', text)
    page = target.group(1) if target else text
    if not (DOCS / f'{page}.rst').is_file():
        source, line = inliner.reporter.get_source_and_line(lineno)
        _Checks.problems.append(f'{source}:{line}: :doc:`{page}` has no {page}.rst in {DOCS.name}')
    return [nodes.literal(rawtext, text)], []


for _name in ('schematic', 'cite', 'cite.dblp', 'tabs', 'tab'):
    directives.register_directive(_name, NoOp)
directives.register_directive('related', Related)
directives.register_directive('autoclass', _importing(_isclass))
directives.register_directive('autofunction', _importing(_isfunction))
directives.register_directive('toctree', TocTree)
directives.register_directive('code-block', CodeBlock)  # sphinx's name for docutils' ``code``
roles.register_local_role('class', _python_role(_isclass))
roles.register_local_role('func', _python_role(_isfunction))
for _name in ('meth', 'mod', 'attr', 'data', 'obj'):
    roles.register_local_role(_name, _python_role(None))
roles.register_local_role('doc', doc_role)


@pytest.mark.parametrize('page', PAGES, ids=[p.name for p in PAGES])
def test_page_parses_and_its_targets_import(page):
    _Checks.problems = []
    warnings = io.StringIO()
    publish_doctree(page.read_text(encoding='utf-8'), source_path=str(page),
                    settings_overrides={'report_level': 2, 'halt_level': 5, 'warning_stream': warnings,
                                        'file_insertion_enabled': False, 'raw_enabled': False})
    problems = _Checks.problems + [w for w in warnings.getvalue().splitlines() if w.strip()]
    assert not problems, f'{page.name}: fix these lines:\n' + '\n'.join(problems)


def test_docs_hold_the_pages_the_index_promises():
    names = {p.stem for p in PAGES}
    assert {'index', 'dime', 'thresholds', 'pruned', 'llm', 'results', 'theory', 'api'} <= names


def test_every_public_name_has_an_api_entry():
    import pyterrier_rdime
    api = (DOCS / 'api.rst').read_text(encoding='utf-8')
    documented = set(re.findall(r'^\.\. auto(?:class|function):: pyterrier_rdime\.(\w+)', api, re.M))
    public = {n for n in pyterrier_rdime.__all__ if n != 'maths'}
    assert public - documented == set(), f'add these to pt_docs/api.rst: {sorted(public - documented)}'


def test_the_checker_catches_a_broken_page(tmp_path):
    """The checks above must be able to fail: a wrong autoclass target, a missing :doc: page and bad markup."""
    _Checks.problems = []
    warnings = io.StringIO()
    bad = ('Title\n=====\n\n.. autoclass:: pyterrier_rdime.NoSuchStage\n\nSee :doc:`nowhere`.\n\n'
           '.. related:: pyterrier_rdime.Rdime\n\n* a list\nnot indented\n')
    publish_doctree(bad, source_path=str(tmp_path / 'bad.rst'),
                    settings_overrides={'report_level': 2, 'halt_level': 5, 'warning_stream': warnings})
    found = '\n'.join(_Checks.problems)
    assert 'pyterrier_rdime.NoSuchStage does not import' in found
    assert ":doc:`nowhere`" in found
    assert 'Rdime' not in found
    assert 'bad.rst:11' in warnings.getvalue()  # the unindented list continuation


def python_blocks(page: Path) -> list:
    """The sources of a page's ``code-block:: python`` blocks, in order (``schematic`` blocks are the docs build's)."""
    tree = publish_doctree(page.read_text(encoding='utf-8'), source_path=str(page),
                           settings_overrides={'report_level': 5, 'file_insertion_enabled': False})
    return [block.astext() for block in tree.findall(nodes.literal_block) if 'python' in block.get('classes', [])]


def bound_and_used(source: str):
    """The names a block of code binds (assignments, imports, definitions, parameters, loop and ``with`` targets)
    and those it reads."""
    bound, used = set(), set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name):
            (used if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((alias.asname or alias.name).split('.')[0] for alias in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return bound, used


def undefined_names(blocks: list, given: set) -> list:
    """``(block number, names)`` for each block that reads a name that neither it, an earlier block nor ``given``
    binds, nor a builtin: the blocks of a page run in order, like a notebook's cells."""
    known, problems = set(given) | set(dir(builtins)), []
    for number, source in enumerate(blocks, 1):
        bound, used = bound_and_used(source)
        known |= bound
        if used - known:
            problems.append((number, sorted(used - known)))
    return problems


def test_every_code_block_is_given_the_names_it_uses():
    """A reader runs a page's code after the index page's setup for the examples (``dataset``, ``model``, ``index``,
    ``bm25``, ``candidates``): each block must use only those, builtins and what the page's blocks bind."""
    given = bound_and_used(python_blocks(DOCS / 'index.rst')[0])[0]  # the setup: the index page's first block
    assert {'dataset', 'model', 'index', 'bm25', 'candidates'} <= given
    problems = {page.name: undefined_names(python_blocks(page), given) for page in PAGES}
    assert {name: found for name, found in problems.items() if found} == {}


def test_the_name_check_catches_an_undefined_name():
    blocks = ['from pyterrier_rdime import Rdime\npipe = candidates >> Rdime()',
              'for k in (1, 2):\n    print(pipe % k, len(unknown))']
    assert undefined_names(blocks, given={'candidates'}) == [(2, ['unknown'])]
    assert undefined_names(blocks, given=set()) == [(1, ['candidates']), (2, ['unknown'])]


def _clone_address() -> str:
    setup = configparser.ConfigParser()
    setup.read(ROOT / 'setup.cfg', encoding='utf-8')
    return setup['metadata']['url']


def test_the_clone_address_is_the_same_everywhere():
    """setup.cfg's ``url`` is the one place the address is set: the README, the docs and the notebooks' Colab badges
    and install cells repeat it."""
    url = _clone_address()
    owner_repo = url.removeprefix('https://github.com/')
    texts = {p.name: p.read_text(encoding='utf-8') for p in [ROOT / 'README.md', *PAGES]}
    for nb in sorted((ROOT / 'notebooks').glob('*.ipynb')):
        cells = json.loads(nb.read_text(encoding='utf-8'))['cells']
        texts[nb.name] = '\n'.join(''.join(c['source']) for c in cells)
    seen = {}
    for name, text in texts.items():
        for found in re.findall(r'github(?:\.com)?/([\w.-]+/pyterrier-rdime)\b', text):
            seen.setdefault(found, []).append(name)
    assert set(seen) == {owner_repo}, f'setup.cfg says {owner_repo}; these files differ: {seen}'
    assert f'REPO={url}' in texts['README.md']


def readme_link_problems(text: str, url: str) -> list:
    """What would break when ``text``, a Markdown page, is shown away from the repository (PyPI's long description):
    a link or image that is not absolute, a reference without its definition, a link into the repository (``url``
    ``/blob/main/…`` or, for an image, ``/raw/main/…``, which serves the file itself) naming a file that does not
    exist."""
    problems = []
    inline = re.findall(r'(!?)\[[^\]]*\]\(([^)\s]+)\)', text)
    definitions = dict(re.findall(r'^\[([^\]]+)\]:\s*(\S+)', text, re.M))
    referenced = re.findall(r'(!?)\[[^\]]*\]\[([^\]]+)\]', text)
    for label in {label for _, label in referenced} - set(definitions):
        problems.append(f'[{label}] is used but not defined')
    targets = inline + [(bang, definitions[label]) for bang, label in referenced if label in definitions]
    for bang, target in targets:
        if not target.startswith('https://'):
            problems.append(f'{target}: not an absolute https:// address')
            continue
        kind, what = ('raw', 'an image') if bang else ('blob', 'a link')
        if target.startswith(f'{url}/') and not target.startswith(f'{url}/{kind}/main/'):
            problems.append(f'{target}: {what} into the repository starts {url}/{kind}/main/')
        elif target.startswith(f'{url}/{kind}/main/'):
            path = target[len(f'{url}/{kind}/main/'):].split('#')[0]
            if not (ROOT / path).exists():
                problems.append(f'{target}: no {path} in the repository')
    return problems


def test_the_readme_links_absolutely_as_pypi_needs():
    """setup.cfg uses the README as the long description: PyPI shows it away from the repository, where a relative
    link or image is broken."""
    url = _clone_address()
    assert readme_link_problems((ROOT / 'README.md').read_text(encoding='utf-8'), url) == []
    bad = (f'[a](pyterrier_rdime/pt_docs/dime.rst) ![b][svg] [c][nowhere] [d]({url}/blob/main/no_such_file.rst)\n\n'
           f'[svg]: {url}/blob/main/pyterrier_rdime/pt_docs/speed_pipelines.svg\n')
    assert readme_link_problems(bad, url) == [
        '[nowhere] is used but not defined',
        'pyterrier_rdime/pt_docs/dime.rst: not an absolute https:// address',
        f'{url}/blob/main/no_such_file.rst: no no_such_file.rst in the repository',
        f'{url}/blob/main/pyterrier_rdime/pt_docs/speed_pipelines.svg: an image into the repository starts '
        f'{url}/raw/main/']


def test_nothing_points_outside_the_repository():
    for path in [ROOT / 'README.md', *PAGES]:
        for number, line in enumerate(path.read_text(encoding='utf-8').splitlines(), 1):
            assert '../' not in line, f'{path.name}:{number} points outside the repository: {line.strip()}'
