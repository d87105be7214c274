"""The code base's shape: no import cycle, no import up a floor, no borrowed private names, and a new
algorithm needs one file.

The import graph is read from the source (every ``import``, at module level or inside a function;
not those under ``if TYPE_CHECKING:``, which never run), over the suite's four packages. They are
floors, the ground first: the algorithms, the runner (``benchmarks``), the analysis, and the
measuring commands (``tools``); a package imports its own floor and those below, never one above. A
package's ``__init__`` counts where it is imported for a name it defines, not as the parent of
every submodule (as import linters count it). Private names are looked for in the tests too: a test
that reaches into a module's private name pins what the module may change freely.
"""

from __future__ import annotations

import ast
import json
import multiprocessing
from pathlib import Path

import torch

import algorithms
from algorithms.base import Algorithm
from algorithms.comm import flat_average_

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("algorithms", "benchmarks", "analysis", "tools")  # the floors, the ground first


def _modules(packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    found = {}
    for package in packages:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement that can run (``if TYPE_CHECKING:`` blocks left out)."""
    found = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _graph() -> dict[str, set[str]]:
    """module -> the suite's modules it imports."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in _imports(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:  # ``from package import module`` imports the module; ``from module import name``, the module
                targets = [
                    f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module or ""
                    for alias in node.names
                ]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_between_the_suites_modules():
    graph = _graph()
    assert graph["benchmarks.run"] >= {"benchmarks.launcher", "benchmarks.recorder"}  # the walk sees imports
    assert _cycles(graph) == []


def _upward(graph: dict[str, set[str]], floors: tuple[str, ...] = PACKAGES) -> list[str]:
    """The imports from a package to one on a higher floor, as ``module -> module``."""
    floor = {package: i for i, package in enumerate(floors)}

    def of(module: str) -> int:
        return floor[module.split(".")[0]]

    return sorted(
        f"{name} -> {target}" for name, targets in graph.items() for target in targets if of(target) > of(name)
    )


def test_the_floor_finder_finds_an_import_up_a_floor():
    floors = ("low", "high")
    assert _upward({"low.a": {"high.b"}, "high.b": {"low.c"}, "low.c": set()}, floors) == ["low.a -> high.b"]
    assert _upward({"high.b": {"low.c", "high.d"}, "high.d": set(), "low.c": set()}, floors) == []


def test_no_package_imports_one_on_a_higher_floor():
    """The runner never imports the analysis or the measuring commands; the analysis never the commands."""
    graph = _graph()
    assert graph["tools.calibrate"] >= {"benchmarks.run", "analysis.overview"}  # the walk sees the floors above
    assert "benchmarks.virtual.job" in graph  # the virtual cluster is on the runner's floor
    assert _upward(graph) == []


# What the virtual cluster (the engine) may import from the runner's package besides itself: the
# straggler models its clock draws from. Never the runner, its launcher or its loop.
ENGINE = "benchmarks.virtual"
ENGINE_READS = {"benchmarks", "benchmarks.stragglers"}


def _engine_reaches(graph: dict[str, set[str]]) -> list[str]:
    """The engine's imports of the runner's package outside itself and ``ENGINE_READS``."""
    return sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if module == ENGINE or module.startswith(ENGINE + ".")
        for target in targets
        if target.startswith("benchmarks")
        and not (target == ENGINE or target.startswith(ENGINE + "."))
        and target not in ENGINE_READS
    )


def test_the_engine_finder_finds_an_import_of_the_runner():
    graph = {"benchmarks.virtual.job": {"benchmarks.launcher", "benchmarks.virtual.clock", "algorithms.comm"}}
    assert _engine_reaches(graph) == ["benchmarks.virtual.job -> benchmarks.launcher"]


def test_the_virtual_cluster_imports_neither_the_runner_nor_its_launcher():
    """The engine runs the runner's ``train`` as it is given it; it imports none of the runner's modules."""
    assert _engine_reaches(_graph()) == []


def test_the_runner_reads_top_to_bottom_in_350_lines_or_fewer():
    """The training loop stays one short file: setup, the loop, the end (helpers live in their modules)."""
    lines = len((ROOT / "benchmarks" / "run.py").read_text().splitlines())
    assert lines <= 350, f"benchmarks/run.py has {lines} lines; move what is not the loop to its module"


def _module_named(node: ast.expr, bound: dict[str, str]) -> str | None:
    """The dotted module name an expression spells (``a.b`` with ``a`` bound to ``pkg``: ``pkg.b``), or None."""
    if isinstance(node, ast.Name):
        return bound.get(node.id)
    if isinstance(node, ast.Attribute):
        owner = _module_named(node.value, bound)
        return f"{owner}.{node.attr}" if owner else None
    return None


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _called(call: ast.Call) -> str:
    """The name a call calls: ``setattr`` of ``setattr(...)`` and of ``monkeypatch.setattr(...)``."""
    return call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")


def _borrowed(name: str, source: str, modules: dict[str, Path]) -> list[str]:
    """Where module ``name`` uses another module's private name: ``from m import _x``; ``m._x`` after
    ``import m``, ``import m as a`` or ``from package import m`` (``pkg.m._x`` after ``import pkg.m``);
    and ``getattr(m, "_x")``, ``setattr``, ``monkeypatch.setattr(m, "_x", ...)`` or its string form
    ``monkeypatch.setattr("m._x", ...)``."""
    tree = ast.parse(source)
    borrowed = []
    bound = {}  # local name -> what it names: one of the modules, or the top package of ``import a.b``
    for node in _imports(tree):
        if isinstance(node, ast.ImportFrom) and node.module in modules:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full in modules:
                    bound[alias.asname or alias.name] = full
                elif _private(alias.name) and node.module != name:
                    borrowed.append(f"{name}: from {node.module} import {alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]  # ``import a.b`` binds ``a``
                bound[alias.asname or top] = alias.name if alias.asname else top

    def foreign(module: str | None) -> bool:
        return module in modules and module != name

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and foreign(_module_named(node.value, bound)):
            borrowed.append(f"{name}: {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and node.args and _called(node) in ("getattr", "setattr", "delattr", "hasattr"):
            first, *rest = node.args
            named = rest[0].value if rest and isinstance(rest[0], ast.Constant) else None
            if isinstance(named, str):
                hit = _private(named) and foreign(_module_named(first, bound))
            elif isinstance(first, ast.Constant) and isinstance(first.value, str):  # monkeypatch's "module._x"
                module, _, attr = first.value.rpartition(".")
                hit = _private(attr) and foreign(module)
            else:
                hit = False
            if hit:
                borrowed.append(f"{name}: {ast.unparse(node)}")
    return borrowed


def test_the_private_name_finder_finds_each_form():
    modules = dict.fromkeys(["pkg", "pkg.m", "pkg.n"], ROOT)
    planted = {
        "from pkg.m import _x": "from pkg.m import _x",
        "import pkg.m\npkg.m._x()": "pkg.m._x",
        "import pkg.m as a\na._x": "a._x",
        "from pkg import m\nm._x": "m._x",
        "import pkg\npkg._x": "pkg._x",
        "from pkg import m\ndef f(monkeypatch):\n    monkeypatch.setattr(m, '_x', 1)": "monkeypatch.setattr(m, '_x', 1)",
        "def f(monkeypatch):\n    monkeypatch.setattr('pkg.m._x', 1)": "monkeypatch.setattr('pkg.m._x', 1)",
        "from pkg import m\ngetattr(m, '_x')": "getattr(m, '_x')",
    }
    for source, found in planted.items():
        assert _borrowed("pkg.n", source, modules) == [f"pkg.n: {found}"], source
    allowed = [
        "from pkg.m import x\nimport pkg.m\npkg.m.x, pkg.m.__name__",  # public and dunder names
        "import torch\ntorch._C",  # a private name of a module outside the suite
        "from pkg import n\nn._x",  # its own
        "from pkg import m\nm.thing._x",  # an object's attribute, which a static reading cannot place
    ]
    for source in allowed:
        assert _borrowed("pkg.n", source, modules) == [], source


def test_no_module_uses_a_private_name_of_another():
    modules = _modules((*PACKAGES, "tests"))
    borrowed = [found for name, path in modules.items() for found in _borrowed(name, path.read_text(), modules)]
    assert borrowed == []


# ---- the tests mirror the packages -----------------------------------------------------------------------

TESTS = ROOT / "tests"
# test folder -> the package whose modules its files test (``workflow``: the Snakefile, its profiles, the
# documentation and this file, no package of their own)
TEST_FOLDERS = {
    "algorithms": "algorithms",
    "benchmarks": "benchmarks",
    "virtual": "benchmarks.virtual",
    "analysis": "analysis",
    "tools": "tools",
    "workflow": None,
}
HELPERS = {"conftest.py", "distributed.py", "strict_device.py", "strict_run.py"}  # at tests/, as ``tests.x``


def test_every_test_file_lives_in_a_folder_of_the_layout():
    """No test file at ``tests/`` itself, none outside the layout's folders, no folder nested deeper.

    The folders hold no ``__init__.py``: pytest's default import mode puts ``tests/`` (conftest.py's
    folder) on ``sys.path``, where a package ``tests/analysis/`` would shadow ``analysis``; without
    one, a test file's module is its file name, so the names stay unique across the folders."""
    assert {path.name for path in TESTS.glob("*.py")} == HELPERS
    misplaced = [
        str(path.relative_to(TESTS))
        for path in TESTS.rglob("test_*.py")
        if path.parent.parent != TESTS or path.parent.name not in TEST_FOLDERS
    ]
    assert misplaced == []
    assert sorted(str(path.relative_to(TESTS)) for path in TESTS.rglob("__init__.py")) == []
    names = [path.name for path in TESTS.rglob("test_*.py")]
    assert sorted({name for name in names if names.count(name) > 1}) == []


def _used(path: Path, modules: dict[str, Path]) -> set[str]:
    """The suite's modules a file imports or names as a string (``python -m benchmarks.forkserver``)."""
    tree = ast.parse(path.read_text())
    named = [alias.name for node in _imports(tree) if isinstance(node, ast.Import) for alias in node.names]
    for node in _imports(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            named += [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
    named += [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)]
    return {name for name in named if name in modules}


def test_each_test_file_uses_the_package_its_folder_mirrors():
    """A test file in ``tests/<folder>/`` imports (or runs) a module of the package that folder mirrors."""
    modules = _modules()
    assert _used(TESTS / "benchmarks" / "test_forkserver.py", modules) >= {"benchmarks.forkserver"}
    astray = []
    for folder, package in TEST_FOLDERS.items():
        for path in sorted((TESTS / folder).glob("test_*.py")) if package else []:
            used = _used(path, modules)
            if not any(module == package or module.startswith(f"{package}.") for module in used):
                astray.append(f"{folder}/{path.name}: uses {sorted(used)}")
    assert astray == []


# ---- a new algorithm, defined here, runs through the runner with no other file changed ------------------


class ModelAverage(Algorithm):
    """Average the models after every local step (a new algorithm, defined in a test)."""

    columns = ("averages",)

    def step(self) -> None:
        self.optimizer.step()
        with torch.no_grad():
            flat_average_([p.data for p in self.model.parameters()])
        self.averages = getattr(self, "averages", 0) + 1

    def metrics(self) -> dict[str, float]:
        return {"averages": float(self.averages)}


def _register_and_run(argv: list[str]) -> None:
    from benchmarks import run

    algorithms.register("model_average", ModelAverage)
    raise SystemExit(run.main(argv))


def test_a_new_algorithm_defined_in_a_test_trains_through_the_runner(tmp_path):
    out = tmp_path / "run"
    argv = [
        "--algorithm",
        "model_average",
        "--task",
        "digits",
        "--nodes",
        "1",
        "--procs-per-node",
        "2",
        "--out",
        str(out),
        "--set",
        "epochs=2",
        "--set",
        "wandb=false",
    ]
    child = multiprocessing.get_context("fork").Process(target=_register_and_run, args=(argv,))
    child.start()
    child.join(timeout=240)
    assert child.exitcode == 0, (out / "log.txt").read_text()[-3000:] if (out / "log.txt").exists() else "no log"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["algorithm"] == "model_average"
    assert summary["final_metric"] > 0.9  # digits: 0.1 untrained
    header, *rows = (out / "metrics.csv").read_text().splitlines()
    assert header.endswith(",averages") and float(rows[-1].split(",")[-1]) == summary["steps"]
