"""The packages import one another in one order, with no cycle, and only the torch packages
import torch (a planner installs spectune without it).

Order: traces, policies -> simulator -> models -> {profiler, drafters} -> eagle -> live ->
spectune. The static checks read every import statement of every module, inside functions too:
an import moved into a function hides a cycle, it does not break it. Imports under `if
TYPE_CHECKING:` never run: they count for the order of packages, not for cycles. The run-time
checks import a package and look at what got loaded.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: package -> its layer: a package may import its own modules and those of lower layers only
LAYERS = {"traces": 0, "policies": 0, "simulator": 1, "models": 2, "profiler": 3, "drafters": 3,
          "eagle": 4, "live": 5, "spectune": 6}
TORCH_PACKAGES = {"models", "profiler", "drafters", "eagle", "live"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(path): path for package in LAYERS
            for path in sorted((ROOT / package).rglob("*.py"))}


def type_only_lines(tree: ast.AST) -> set[int]:
    """The lines of `if TYPE_CHECKING:` bodies."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def imports_of(path: Path, modules: dict[str, Path]) -> list[tuple[str, int, bool]]:
    """(imported name, line, type-only) for every import in the file; a `from X import Y`
    names the module X.Y when there is one, else X."""
    out = []
    tree = ast.parse(path.read_text(), str(path))
    typing_only = type_only_lines(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno, node.lineno in typing_only) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}:{node.lineno}: the project imports absolutely"
            base = node.module or ""
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.append((full if full in modules else base, node.lineno,
                            node.lineno in typing_only))
    return out


def import_graph(with_type_only: bool = False
                 ) -> tuple[dict[str, set[str]], list[tuple[str, str, int]]]:
    """(module -> project modules it imports at run time, or also for type checking; every
    import as (module, name, line))."""
    modules = project_modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    every = []
    for name, path in modules.items():
        for imported, line, type_only in imports_of(path, modules):
            every.append((name, imported, line))
            if type_only and not with_type_only:
                continue
            target = imported
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                graph[name].add(target)
    return graph, every


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_reads_every_package():
    graph, every = import_graph()
    assert {name.split(".")[0] for name in graph} == set(LAYERS)
    assert ("live.engine", "live.loop") in {(a, b) for a, b, _ in every}  # the probe sees imports
    assert "live.loop" in graph["live.mixed"]
    assert "simulator.logs" not in graph["simulator.scheduler"]  # type-only
    assert "simulator.logs" in import_graph(with_type_only=True)[0]["simulator.scheduler"]


def test_no_import_cycle():
    found = cycles(import_graph()[0])
    assert not found, f"import cycles: {found}"


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_packages_import_only_lower_layers():
    graph, _ = import_graph(with_type_only=True)
    wrong = [f"{a} imports {b}" for a, targets in graph.items() for b in targets
             if a.split(".")[0] != b.split(".")[0]
             and LAYERS[b.split(".")[0]] >= LAYERS[a.split(".")[0]]]
    assert not wrong, "against the order traces, policies -> simulator -> models -> " \
                      "{profiler, drafters} -> eagle -> live -> spectune: " + "; ".join(wrong)


def test_only_the_torch_packages_import_torch():
    _, every = import_graph()
    wrong = [f"{module}:{line}" for module, name, line in every
             if name.split(".")[0] == "torch" and module.split(".")[0] not in TORCH_PACKAGES]
    assert not wrong, f"torch imported outside {sorted(TORCH_PACKAGES)}: {wrong}"


#: run time: importing the package (or running a simulation) loads none of these
FORBIDDEN = {
    "traces": ("torch", "simpy", "policies", "simulator", "spectune", *TORCH_PACKAGES),
    "policies": ("torch", "simpy", "traces", "simulator", "spectune", *TORCH_PACKAGES),
    "simulator": ("torch", "spectune", *TORCH_PACKAGES),
    "spectune.cli": ("torch", *TORCH_PACKAGES),
}


@pytest.mark.parametrize("module", sorted(FORBIDDEN))
def test_module_does_not_import(module):
    code = (
        f"import sys, {module}\n"
        "if '{0}' == 'spectune.cli':\n"
        "    from spectune.cli import main\n"
        "    main(['simulate', '--requests', '20', '--format', 'json'])\n"
        "print(' '.join(sorted(m.split('.')[0] for m in sys.modules)))\n"
    ).replace("{0}", module)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=ROOT)
    loaded = set(out.stdout.split())
    assert module.split(".")[0] in loaded  # the probe itself works
    for name in FORBIDDEN[module]:
        assert name not in loaded, f"{module} imports {name}"
