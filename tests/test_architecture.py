"""The package's import graph, read from the source (an AST walk; nothing is imported): no import
cycle, whether the imports sit at module level or inside functions, no command package that imports
another command package or the CLI module (what two commands share lives in a library module), and
nothing outside rltbench/commands (library modules, scripts/*.py) that imports a command: library code
lives in the library, and a command is reached only through the CLI, which names its modules by string.

`from pkg import sub` depends on the submodule `pkg.sub` (Python imports it even while `pkg` itself is
still initialising); `from pkg import name` of anything else depends on `pkg`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "rltbench"
SCRIPTS = PACKAGE.parent / "scripts"


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package under `root`."""
    out = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _targets(node: ast.Import | ast.ImportFrom, here: str, is_pkg: bool, known: set[str]) -> Iterable[str]:
    if isinstance(node, ast.Import):
        for alias in node.names:
            name = alias.name
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                yield name
        return
    base = node.module or ""
    if node.level:  # relative: resolved against this module's package
        pkg = here if is_pkg else here.rpartition(".")[0]
        for _ in range(node.level - 1):
            pkg = pkg.rpartition(".")[0]
        base = f"{pkg}.{base}" if base else pkg
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        if sub in known:
            yield sub
        elif base in known:
            yield base


def import_graph(mods: dict[str, Path], extra: dict[str, Path] | None = None) -> dict[str, set[str]]:
    """Module -> the package modules it imports anywhere in its file (module level or in functions).
    `extra` adds files outside the package (scripts, named e.g. `scripts/x.py`) as importers only."""
    known = set(mods)
    graph: dict[str, set[str]] = {}
    for mod, path in {**mods, **(extra or {})}.items():
        is_pkg = path.name == "__init__.py"
        graph[mod] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[mod].update(t for t in _targets(node, mod, is_pkg, known) if t != mod)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def command_of(module: str) -> str | None:
    """`e2e` for rltbench.commands.e2e.job; None outside the command packages."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "commands" else None


def forbidden_command_imports(graph: dict[str, set[str]]) -> list[str]:
    """'a -> b' for every command module importing another command package or rltbench.cli."""
    bad = []
    for src, targets in sorted(graph.items()):
        cmd = command_of(src)
        if cmd is None:
            continue
        for dst in sorted(targets):
            other = command_of(dst)
            if dst == "rltbench.cli" or (other is not None and other != cmd):
                bad.append(f"{src} -> {dst}")
    return bad


def imports_of_commands_from_outside(graph: dict[str, set[str]]) -> list[str]:
    """'a -> b' for every module outside rltbench.commands (or script) importing a command module."""
    return [f"{src} -> {dst}" for src, targets in sorted(graph.items())
            if command_of(src) is None and src != "rltbench.commands"
            for dst in sorted(targets) if command_of(dst) is not None or dst == "rltbench.commands"]


def scripts(root: Path = SCRIPTS) -> dict[str, Path]:
    """`scripts/x.py` -> file, for every Python script."""
    return {f"{root.name}/{path.name}": path for path in sorted(root.glob("*.py"))}


GRAPH = import_graph(modules())


def test_no_import_cycles() -> None:
    found = cycles(GRAPH)
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_command_imports_another_command_or_the_cli() -> None:
    bad = forbidden_command_imports(GRAPH)
    assert not bad, "command packages must share through library modules:\n" + "\n".join(bad)


def test_nothing_outside_the_commands_imports_a_command() -> None:
    bad = imports_of_commands_from_outside(import_graph(modules(), scripts()))
    assert not bad, "library modules and scripts must not import commands:\n" + "\n".join(bad)


def test_the_checker_sees_function_level_cycles_and_command_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "rltbench"
    for rel, text in {
        "__init__.py": "",
        "lib.py": "def f():\n    from rltbench import helper\n",
        "library.py": "def g():\n    from rltbench.commands.b import other\n",
        "helper.py": "from rltbench.lib import f\n",
        "cli.py": "",
        "commands/__init__.py": "",
        "commands/a/__init__.py": "",
        "commands/a/run.py": "from rltbench.commands.b import run\nimport rltbench.cli\n",
        "commands/b/__init__.py": "",
        "commands/b/run.py": "from . import other\n",
        "commands/b/other.py": "from rltbench.lib import f\n",
    }.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    graph = import_graph(modules(pkg))
    assert cycles(graph) == [["rltbench.helper", "rltbench.lib"]]
    assert forbidden_command_imports(graph) == [
        "rltbench.commands.a.run -> rltbench.cli", "rltbench.commands.a.run -> rltbench.commands.b.run"]
    assert graph["rltbench.commands.b.run"] == {"rltbench.commands.b.other"}
    (tmp_path / "scripts").mkdir()
    tool = tmp_path / "scripts" / "tool.py"
    tool.write_text("import rltbench.commands.a.run\nfrom rltbench import lib\n")
    graph = import_graph(modules(pkg), scripts(tmp_path / "scripts"))
    assert imports_of_commands_from_outside(graph) == [
        "rltbench.library -> rltbench.commands.b.other", "scripts/tool.py -> rltbench.commands.a.run"]


TIMING = PACKAGE / "bench" / "timing.py"


def cuda_event_files(roots: Iterable[Path]) -> list[Path]:
    """Python files under `roots` whose source names `cuda.Event` (creates or types a CUDA event)."""
    return sorted(p for root in roots for p in root.rglob("*.py") if "cuda.Event" in p.read_text())


def test_only_bench_timing_creates_cuda_events() -> None:
    """Every CUDA-event loop goes through rltbench/bench/timing.py, so what a figure times (the sync,
    the warm-up, the samples) is decided in one place (docs/measurement.md)."""
    found = cuda_event_files([PACKAGE, PACKAGE.parent / "scripts"])
    assert found == [TIMING], "CUDA events outside bench/timing.py: " + ", ".join(
        str(p.relative_to(PACKAGE.parent)) for p in found if p != TIMING)
