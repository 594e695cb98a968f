"""Every project module imports on its own, and fedapps has no import cycle.

Why: fedapps.config, data, registry and runtime used to import each other in a cycle that only
function-level imports kept alive; moving one import broke `import fedapps.client_app`. The
static check below sees imports inside functions too, so such a dodge cannot come back.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from collections.abc import Collection
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("fedapps", "clients", "strategies", "simulations")


def project_modules() -> dict[str, Path]:
    """Dotted name -> file for every module under the project's packages."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def imported_names(path: Path, module: str, modules: Collection[str] = (),
                   top_level_only: bool = False) -> set[str]:
    """Every module named by an import statement anywhere in the file (functions included),
    or only by the module's own top-level statements; `if TYPE_CHECKING:` blocks never run."""
    names: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    for block in ast.walk(tree):
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test):
            block.body = []
    for node in tree.body if top_level_only else ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}".rstrip(".")
            for alias in node.names:  # `from a import b`: a.b when b is a module, else a
                dotted = f"{base}.{alias.name}"
                names.add(dotted if dotted in modules else base)
    return names


def import_graph() -> dict[str, set[str]]:
    """Project module -> the project modules it imports (a package's __init__ running before
    its submodules is not counted: that order is Python's, not a cycle)."""
    modules = project_modules()
    return {mod: {n for n in imported_names(path, mod, modules) if n in modules and n != mod}
            for mod, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None (iterative DFS with colours)."""
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    for start in sorted(graph):
        if start in state:
            continue
        stack = [(start, iter(sorted(graph[start])))]
        path = [start]
        state[start] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[node] = 2
                stack.pop()
                path.pop()
            elif state.get(child) == 1:
                return path[path.index(child):] + [child]
            elif child not in state:
                state[child] = 1
                stack.append((child, iter(sorted(graph[child]))))
                path.append(child)
    return None


def test_cycle_finder_finds_the_old_config_registry_cycle():
    old = {"fedapps.config": {"fedapps.registry"}, "fedapps.registry": {"fedapps.runtime"},
           "fedapps.runtime": {"fedapps.config"}, "fedapps.data": set()}
    assert find_cycle(old) == ["fedapps.config", "fedapps.registry", "fedapps.runtime",
                               "fedapps.config"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_among_project_modules():
    graph = import_graph()
    assert "fedapps.validation" in graph and "fedapps.errors" in graph
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


def test_layers():
    """config loads and merges only; data imports only leaves; errors/paths/settings are leaves,
    and so is pretrained (VGG-19's conv layers and weights: the FedAIoT feature clusters)."""
    graph = import_graph()
    leaves = {"fedapps.errors", "fedapps.paths", "fedapps.settings", "fedapps.pretrained"}
    assert graph["fedapps.errors"] == set() and graph["fedapps.paths"] == set()
    assert graph["fedapps.settings"] == {"fedapps.errors"}
    assert graph["fedapps.pretrained"] == {"fedapps.errors"}
    assert graph["fedapps.config"] <= leaves
    data = {m for m in graph if m == "fedapps.data" or m.startswith("fedapps.data.")}
    for mod in data:
        assert graph[mod] <= leaves | data, (mod, graph[mod] - leaves - data)


def test_every_module_imports_in_a_fresh_interpreter():
    """One interpreter pre-imports the third-party libraries (torch, Flower: seconds each),
    then forks one child per project module, which imports it with no project module loaded.
    About 12 s for ~50 modules on 2 cores, instead of ~4 minutes with one interpreter each."""
    modules = sorted(project_modules())
    third_party = sorted({name for mod, path in project_modules().items()
                          for name in imported_names(path, mod, top_level_only=True)
                          if name.split(".")[0] not in (*PACKAGES, *sys.stdlib_module_names)})
    script = textwrap.dedent("""
        import importlib, os, sys, traceback
        deps, modules = sys.argv[1].split(","), sys.argv[2].split(",")
        for dep in deps:  # names such as `flwr.common.Context` are not modules: skip those
            try:
                importlib.import_module(dep)
            except ImportError:
                pass
        assert not any(m.split(".")[0] in {"fedapps", "clients", "strategies", "simulations"}
                       for m in sys.modules), "a third-party import pulled in project code"
        failed = []
        for mod in modules:
            pid = os.fork()
            if pid == 0:
                try:
                    importlib.import_module(mod)
                except BaseException:
                    traceback.print_exc()
                    os._exit(1)
                os._exit(0)
            if os.waitpid(pid, 0)[1] != 0:
                failed.append(mod)
        print("FAILED:" + ",".join(failed))
    """)
    proc = subprocess.run([sys.executable, "-c", script, ",".join(third_party),
                           ",".join(modules)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "FAILED:\n" in proc.stdout, f"{proc.stdout[-500:]}\n{proc.stderr[-3000:]}"
