"""The package's layering, read from the source (this file tests no single module).

- Packages stack: `core` < `analysis` < `config` < `scrape` < `state` < `server` < `web` <
  `cli`; a module imports only from its own package and the ones below it. `client` (stdlib
  only) and `fakevllm` (never imported by `serve`) sit beside the stack and read `core` and
  `analysis` only, and `cli` may import them. No import cycle between modules, function-level
  imports included.
- No module over ~500 lines, no function over ~60.
- The pure domain imports no I/O library.
- Readers (/metrics, the JSON views, the HTML pages) take a `StateView`: they import none of
  the service's parts (targets aside, whose `TargetState` is what the view holds), nor the
  service, nor the HTTP layer.
- `core` and `server` never import `web` (window semantics live below HTTP), and nothing but
  the service itself assigns attributes onto the service (`service.x = ...`): its parts are
  wired inside it.
- No code reads another object's private attribute (`x._name` with `x` not `self` or `cls`)
  unless its own module defines that name: no module, test or bench case reaches into the
  internals of another's objects. `self._x` is not checked: a subclass of a third-party class
  (`guard.GuardedSite` of aiohttp's `TCPSite`) may use what its base class gives subclasses.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXPORTER = ROOT / "exporter"

STACK = ("core", "analysis", "config", "scrape", "state", "server", "web", "cli")
BESIDE = {"client": {"core", "analysis"}, "fakevllm": {"core"}, "__main__": {"cli"}}
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60

READERS = ("web/exposition", "web/jsonviews", "web/pages/landing", "web/pages/window",
           "web/pages/compare", "web/pages/advice", "web/pages/html")
NOT_FOR_READERS = {"exporter.server.service", "exporter.server.book",
                   "exporter.server.scheduler", "exporter.state.store",
                   "exporter.scrape.scraper", "exporter.web.handlers", "exporter.web.app",
                   "exporter.web.fanout"}

# namedtuple's public API starts with an underscore.
NAMEDTUPLE = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}
# argparse offers no public way to list a parser's options (test_cli checks their help);
# os._exit is the documented way out of a forked child (exporter/server/isolate.py).
ALLOWED = {"_actions", "_SubParsersAction", "_exit"}


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def _modules() -> dict[str, Path]:
    """Dotted name -> file of every module of the package."""
    found = {}
    for path in EXPORTER.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts).removesuffix(".__init__")
        found[name] = path
    return found


def _room(name: str) -> str:
    """The package of exporter.<room>.x (or the top-level module's own name)."""
    return name.split(".")[1]


def upward_imports(modules: dict[str, Path]) -> list[str]:
    """`module -> import` for every import that reaches above or outside the importer's room."""
    found = []
    for name, path in sorted(modules.items()):
        if name == "exporter":
            continue
        room = _room(name)
        for imported in sorted(_imports(path)):
            if imported not in modules or imported == "exporter":
                continue
            other = _room(imported)
            if other == room:
                continue
            if room == "cli":
                allowed = True  # the top: the commands run the client and the simulator too
            elif room in STACK:
                allowed = other in STACK and STACK.index(other) < STACK.index(room)
            else:
                allowed = other in BESIDE.get(room, set())
            if not allowed:
                found.append(f"{name} -> {imported}")
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    # `from exporter.x import y` imports the package exporter.x, and y when y is a module.
    return {name: {m for m in _imports(path) if m in modules and m not in (name, "exporter")}
            for name, path in modules.items()}


def oversized(modules: dict[str, Path]) -> list[str]:
    found = []
    for name, path in sorted(modules.items()):
        source = path.read_text()
        if (lines := len(source.splitlines())) > MAX_MODULE_LINES:
            found.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if length > MAX_FUNCTION_LINES:
                    found.append(f"{name}.{node.name}: {length} lines")
    return found


def _defined(tree: ast.AST) -> set[str]:
    """Every name a module defines: functions, classes, assigned names and attributes."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for sub in ast.walk(target):
                    if isinstance(sub, ast.Name):
                        names.add(sub.id)
                    elif isinstance(sub, ast.Attribute):
                        names.add(sub.attr)
    return names


def private_reads(source: str) -> list[str]:
    """`line: expression` of every read of another object's private attribute defined elsewhere."""
    tree = ast.parse(source)
    own = _defined(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        name = node.attr
        if not name.startswith("_") or name.startswith("__") or name in own:
            continue
        if name in NAMEDTUPLE or name in ALLOWED:
            continue
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            continue
        found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


class TestPackages:
    def test_each_package_imports_only_from_those_below_it(self):
        assert upward_imports(_modules()) == []

    def test_the_check_sees_an_upward_import(self, tmp_path):
        core = tmp_path / "exporter" / "core"
        core.mkdir(parents=True)
        (core / "low.py").write_text("from exporter.web.app import make_app\n")
        (tmp_path / "exporter" / "web").mkdir()
        (tmp_path / "exporter" / "web" / "app.py").write_text("from exporter.core import low\n")
        modules = {"exporter.core.low": core / "low.py",
                   "exporter.web.app": tmp_path / "exporter" / "web" / "app.py"}
        assert upward_imports(modules) == ["exporter.core.low -> exporter.web.app"]

    def test_no_import_cycle(self):
        assert cycles(import_graph(_modules())) == []

    def test_the_check_sees_a_cycle(self):
        graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
        assert cycles(graph) == [["a", "b", "c"]]

    def test_no_module_or_function_over_the_size_limits(self):
        assert oversized(_modules()) == []


class TestPureDomain:
    def test_domain_and_client_import_no_io_libraries(self):
        # A fresh interpreter: what importing the domain (and the stdlib-only client) loads.
        modules = ("exporter.core.snapshot", "exporter.core.counting", "exporter.core.window",
                   "exporter.core.derive", "exporter.core.stopanswer", "exporter.core.console",
                   "exporter.client")
        code = (
            "import importlib, sys\n"
            f"for name in {modules!r}:\n"
            "    importlib.import_module(name)\n"
            "print(sorted(m for m in ('aiohttp', 'pydantic', 'yaml', 'multidict', 'yarl')"
            " if m in sys.modules))\n"
        )
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        assert done.stdout == "[]\n"


class TestReaders:
    @pytest.mark.parametrize("module", READERS)
    def test_reads_the_view_not_the_parts(self, module):
        assert _imports(EXPORTER / f"{module}.py") & NOT_FOR_READERS == set()

    def test_the_check_sees_an_import_of_a_part(self, tmp_path):
        path = tmp_path / "reader.py"
        path.write_text("from exporter.server.book import WindowBook\n"
                        "import exporter.state.store\n")
        assert _imports(path) & NOT_FOR_READERS == {"exporter.server.book", "exporter.state.store"}


class TestNoPrivateReads:
    def test_no_reads_of_private_attributes_defined_elsewhere(self):
        found = {}
        for folder in ("exporter", "tests", "bench"):
            for path in sorted((ROOT / folder).rglob("*.py")):
                if reads := private_reads(path.read_text()):
                    found[path.relative_to(ROOT).as_posix()] = reads
        assert found == {}

    def test_the_check_sees_one(self):
        source = (
            "class Own:\n"
            "    def __init__(self):\n"
            "        self._mine = 1\n"
            "    def same(self, other):\n"
            "        return other._mine + self._theirs\n"  # both allowed
            "def reach(service):\n"
            "    return service.book.store._db, key._replace(a=1)\n"
        )
        assert private_reads(source) == ["7: service.book.store._db"]


def _is_service(node: ast.expr) -> bool:
    """`service`, `x.service` or `x[SERVICE]`: an expression naming the running service."""
    if isinstance(node, ast.Name):
        return node.id == "service"
    if isinstance(node, ast.Attribute):
        return node.attr == "service"
    return (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Name)
            and node.slice.id == "SERVICE")


def service_assignments(source: str) -> list[str]:
    """`line: target` of every assignment of an attribute onto the service."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign)
                   else [])
        found += [f"{t.lineno}: {ast.unparse(t)}" for t in targets
                  if isinstance(t, ast.Attribute) and _is_service(t.value)]
    return found


class TestWiring:
    def test_core_and_server_import_nothing_of_web(self):
        modules = _modules()
        assert [f"{name} -> {imported}" for name, path in sorted(modules.items())
                if name.count(".") >= 1 and _room(name) in ("core", "server")
                for imported in sorted(_imports(path)) if imported.startswith("exporter.web")
                ] == []

    def test_nothing_assigns_onto_the_service_from_outside(self):
        found = {}
        for path in sorted(EXPORTER.rglob("*.py")):
            if path != EXPORTER / "server" / "service.py" and (
                    assigned := service_assignments(path.read_text())):
                found[path.relative_to(ROOT).as_posix()] = assigned
        assert found == {}

    def test_the_check_sees_one(self):
        source = ("service.holds = edges.holds\n"
                  "app[SERVICE].clock = now\n"
                  "self.service.version += 1\n"
                  "service.book.version = 2\n")  # a part's own attribute: not the service's
        assert service_assignments(source) == ["1: service.holds", "2: app[SERVICE].clock",
                                               "3: self.service.version"]
