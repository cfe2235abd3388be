"""The package's layers, read from its imports: no import cycle, and no import against the layer order.

Every ``import`` and ``from ... import`` of a module of the package counts, at module level and
inside functions; those under ``if TYPE_CHECKING:`` do not (they never run). The layers, from
the bottom (docs/development.md has the map):

    shared   rq_epoch.errors, rq_epoch.compat, rq_epoch.settings
    adapters rq_epoch.adapters: every contact with RQ's and redis-py's internals (they import
             nothing of the package but the shared modules, and of other packages only rq and redis)
    protocol rq_epoch.protocol: the epoch rule, the keys, the scripts and their typed replies
    jobs     rq_epoch.jobs: RQ's job, registry and queue with the epoch behaviour
    sweep    rq_epoch.sweep: the sweeper, dead letters, dependents
    worker   rq_epoch.worker: the worker (it runs sweeps)
    ops      rq_epoch.ops: the command line, status, metrics, the exporter's page
    api      rq_epoch/__init__.py, which puts the layers together

A module may import from its own layer and the layers below. Apart from these: the demo,
the embedded server and the process helpers (``rq_epoch.demo``, ``rq_epoch.embedded``,
``rq_epoch.pids``), which no layer imports but the command line's ``demo`` command, and the
old module paths kept for one release (``rq_epoch/_moved.py``), which nothing imports.

``python tests/test_layout.py [PACKAGE_DIR]`` prints the graph's depth, its cycles and the
imports inside functions (of this package, or of a copy elsewhere).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / 'rq_epoch'

LAYERS = {
    'shared': 0,
    'adapters': 1,
    'protocol': 2,
    'jobs': 3,
    'sweep': 4,
    'worker': 5,
    'ops': 6,
    'api': 7,
    'apart': 8,
    'moved': 9,
}
SHARED = {'rq_epoch.errors', 'rq_epoch.compat', 'rq_epoch.settings'}
APART = {'rq_epoch.demo', 'rq_epoch.embedded', 'rq_epoch.pids'}

#: Imports allowed against the layer order, each with its reason.
ALLOWED_UPWARD = {
    # The package's one version string, written where setup.cfg reads it.
    ('rq_epoch.ops.cli', 'rq_epoch'): {'__version__'},
    # The command that plays the demo.
    ('rq_epoch.ops.cli', 'rq_epoch.demo'): None,
}
#: Imports inside functions, each a deliberate lazy import (see the comment at the import).
ALLOWED_INSIDE_FUNCTIONS = {('rq_epoch.ops.cli', 'rq_epoch.demo')}


@dataclass(frozen=True)
class Import:
    source: str
    target: str
    names: tuple[str, ...]
    inside_function: bool
    line: int


def module_names(package_dir: Path) -> dict[str, Path]:
    """Every module of the package under ``package_dir``, by dotted name."""
    root = package_dir.parent
    modules = {}
    for path in sorted(package_dir.rglob('*.py')):
        parts = list(path.relative_to(root).with_suffix('').parts)
        if parts[-1] == '__init__':
            parts.pop()
        modules['.'.join(parts)] = path
    return modules


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == 'TYPE_CHECKING') or (
        isinstance(test, ast.Attribute) and test.attr == 'TYPE_CHECKING'
    )


def _statements(nodes: list[ast.stmt], inside_function: bool = False) -> Iterator[tuple[ast.stmt, bool]]:
    """Every import statement among ``nodes`` and inside them, and whether it is in a function."""
    for node in nodes:
        if isinstance(node, ast.If) and _is_type_checking(node):
            yield from _statements(node.orelse, inside_function)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, inside_function
        children = [child for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt)]
        yield from _statements(children, inside_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))


def imports(package_dir: Path) -> list[Import]:
    """The imports of package modules by package modules; ``from a import b`` names module a.b if there is one."""
    modules = module_names(package_dir)
    top = package_dir.name
    found = []
    for name, path in modules.items():
        package = name if path.name == '__init__.py' else name.rpartition('.')[0]
        for node, inside in _statements(ast.parse(path.read_text(encoding='utf-8')).body):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split('.')[0] == top:
                        found.append(Import(name, _known(alias.name, modules), (), inside, node.lineno))
                continue
            if node.level:
                base = package.split('.')[: len(package.split('.')) - node.level + 1]
                target = '.'.join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ''
            if target.split('.')[0] != top:
                continue
            plain = []
            for alias in node.names:
                if f'{target}.{alias.name}' in modules:
                    found.append(Import(name, f'{target}.{alias.name}', (), inside, node.lineno))
                else:
                    plain.append(alias.name)
            if plain:
                found.append(Import(name, _known(target, modules), tuple(plain), inside, node.lineno))
    return found


def _known(target: str, modules: dict[str, Path]) -> str:
    while target not in modules and '.' in target:
        target = target.rpartition('.')[0]
    return target


def _graph(edges: list[Import]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.source, set()).add(edge.target)
        graph.setdefault(edge.target, set())
    return graph


def components(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of the graph (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:  # recursion as deep as the graph: a few dozen modules
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def cycles(edges: list[Import]) -> list[list[str]]:
    """The import cycles: components of more than one module, and modules that import themselves."""
    graph = _graph(edges)
    return [c for c in components(graph) if len(c) > 1 or c[0] in graph[c[0]]]


def depth(edges: list[Import]) -> int:
    """Modules on the longest chain of imports; the modules of a cycle all count, once."""
    graph = _graph(edges)
    found = components(graph)  # Tarjan's order: a component after every component it imports
    of = {member: number for number, component in enumerate(found) for member in component}
    longest: list[int] = []
    for number, component in enumerate(found):
        below = {of[other] for member in component for other in graph[member]} - {number}
        longest.append(len(component) + max((longest[other] for other in below), default=0))
    return max(longest, default=0)


def layer(module: str) -> str:
    """The layer of a module of rq_epoch; fails on a module no layer names."""
    parts = module.split('.')
    if module == 'rq_epoch':
        return 'api'
    if module in SHARED:
        return 'shared'
    if '.'.join(parts[:2]) in APART:
        return 'apart'
    if parts[1] in LAYERS and len(parts) > 1 and (PACKAGE / parts[1]).is_dir():
        return parts[1]
    if parts[1] == '_moved' or _is_moved(module):
        return 'moved'
    raise AssertionError(f'{module} is in no layer: put it in one of the packages, or name it in tests/test_layout.py')


def _is_moved(module: str) -> bool:
    path = PACKAGE / f'{module.split(".")[1]}.py'
    return path.is_file() and 'moved(__name__' in path.read_text(encoding='utf-8')


def against_the_layers(edges: list[Import]) -> list[str]:
    wrong = []
    for edge in edges:
        if LAYERS[layer(edge.target)] <= LAYERS[layer(edge.source)]:
            continue
        key = (edge.source, edge.target)
        if key in ALLOWED_UPWARD and (ALLOWED_UPWARD[key] is None or set(edge.names) <= ALLOWED_UPWARD[key]):
            continue
        wrong.append(
            f'{edge.source} ({layer(edge.source)}) imports {edge.target} ({layer(edge.target)}), line {edge.line}'
        )
    return wrong


def test_the_package_has_no_import_cycle() -> None:
    assert cycles(imports(PACKAGE)) == []


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    assert against_the_layers(imports(PACKAGE)) == []


def test_imports_inside_functions_are_the_deliberate_ones() -> None:
    inside = {(edge.source, edge.target) for edge in imports(PACKAGE) if edge.inside_function}
    assert inside == ALLOWED_INSIDE_FUNCTIONS


def test_adapters_import_only_the_libraries_they_adapt_and_the_shared_modules() -> None:
    inside = [edge for edge in imports(PACKAGE) if layer(edge.source) == 'adapters']
    assert {layer(edge.target) for edge in inside} <= {'shared', 'adapters'}
    for path in (PACKAGE / 'adapters').glob('*.py'):
        for node, _inside in _statements(ast.parse(path.read_text(encoding='utf-8')).body):
            if isinstance(node, ast.ImportFrom) and node.level:
                continue
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or '']
            for name in names:
                top = name.split('.')[0]
                assert top in {'rq', 'redis', '__future__'} or top in sys.stdlib_module_names, (path.name, name)


def test_every_layer_is_a_package() -> None:
    for name in LAYERS:
        if name not in ('shared', 'api', 'apart', 'moved'):
            assert (PACKAGE / name / '__init__.py').is_file(), name


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding='utf-8')
    return root / 'rq_epoch'


def test_a_cycle_through_an_import_inside_a_function_is_found(tmp_path: Path) -> None:
    """The flat layout's cycle, in small: job -> registry (in a function) -> sweep (in a method) -> job."""
    package = _write(
        tmp_path,
        {
            'rq_epoch/__init__.py': 'from .job import Job\n',
            'rq_epoch/job.py': (
                'from typing import TYPE_CHECKING\n'
                'if TYPE_CHECKING:\n    from .worker import Worker\n'
                'class Job:\n    def registry(self):\n'
                '        from .registry import Registry\n'
                '        return Registry()\n'
            ),
            'rq_epoch/registry.py': 'class Registry:\n    def cleanup(self):\n        from . import sweep\n',
            'rq_epoch/sweep.py': 'from .job import Job\n',
            'rq_epoch/worker.py': 'from .job import Job\n',
        },
    )
    edges = imports(package)
    assert cycles(edges) == [['rq_epoch.job', 'rq_epoch.registry', 'rq_epoch.sweep']]
    assert {(e.source, e.target) for e in edges if e.inside_function} == {
        ('rq_epoch.job', 'rq_epoch.registry'),
        ('rq_epoch.registry', 'rq_epoch.sweep'),
    }


def test_an_import_against_the_layers_is_found() -> None:
    edges = [
        Import('rq_epoch.protocol.keys', 'rq_epoch.jobs.job', ('Job',), False, 1),
        Import('rq_epoch.sweep.sweeper', 'rq_epoch.worker.worker', ('Worker',), True, 2),
        Import('rq_epoch.worker.worker', 'rq_epoch.demo', ('run_demo',), False, 3),
        Import('rq_epoch.worker.worker', 'rq_epoch.sweep.sweeper', ('Sweeper',), False, 4),
        Import('rq_epoch.ops.cli', 'rq_epoch', ('Worker',), False, 5),
        Import('rq_epoch.ops.cli', 'rq_epoch', ('__version__',), False, 6),
    ]
    assert [line.rpartition(' ')[2] for line in against_the_layers(edges)] == ['1', '2', '3', '5']


def main(package_dir: Path) -> None:
    edges = imports(package_dir)
    top_level = [edge for edge in edges if not edge.inside_function]
    print(f'modules {len(module_names(package_dir))}')
    print(f'depth (module-level imports) {depth(top_level)}; with imports inside functions {depth(edges)}')
    print(f'cycles (module-level imports) {cycles(top_level)}')
    print(f'cycles (with imports inside functions) {cycles(edges)}')
    inside = sorted({(edge.source, edge.target) for edge in edges if edge.inside_function})
    print(f'imports inside functions {inside}')


if __name__ == '__main__':
    main(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else PACKAGE)
elif not PACKAGE.is_dir():
    pytest.skip('the package is not beside the tests', allow_module_level=True)
