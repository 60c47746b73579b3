"""The package's layering, read from the source (this file tests no single module).

- The pure domain imports no I/O library.
- Readers (/metrics, the JSON views, the HTML pages) take a `StateView`: they import none of
  the service's parts (targets aside, whose `TargetState` is what the view holds), nor the
  service, nor the HTTP layer.
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

READERS = ("exposition", "views", "landing", "window_page", "compare_page", "advice_html",
           "pages")
NOT_FOR_READERS = {"exporter.service", "exporter.book", "exporter.scheduler", "exporter.store",
                   "exporter.scrape", "exporter.api", "exporter.app", "exporter.fanout"}

# namedtuple's public API starts with an underscore.
NAMEDTUPLE = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}
# argparse offers no public way to list a parser's options (test_cli checks their help);
# os._exit is the documented way out of a forked child (exporter/isolate.py).
ALLOWED = {"_actions", "_SubParsersAction", "_exit"}


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
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


class TestPureDomain:
    def test_domain_and_client_import_no_io_libraries(self):
        # A fresh interpreter: what importing the domain (and the stdlib-only client) loads.
        modules = ("exporter.snapshot", "exporter.accounting", "exporter.window",
                   "exporter.derive", "exporter.results", "exporter.console", "exporter.client")
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
        path.write_text("from exporter.book import WindowBook\nimport exporter.store\n")
        assert _imports(path) & NOT_FOR_READERS == {"exporter.book", "exporter.store"}


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
