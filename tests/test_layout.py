"""The library's layout: imports point one way, tools -> families -> engine core, with no circles.

Drawn from the source (every `import` statement, at any depth, so lazy imports count too).  Roles:
  core      scd_core/*.py but the front ends: the engine and what it needs (config, sampling, rng, auto window,
            the adapter protocol); imports core only.
  families  scd_core/models/: the model families and what only they share; imports core and families.
  tools     scd_core/bench/: benchmarks, the device check, the demo's training and quality check, the synthetic
            models; imports anything but the front ends.
  front     scd_core/__init__.py, __main__.py, cli.py (+ cli_shared.py, batch_job.py): what users call; never imported by core or families.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "scd_core"
FRONT = {"scd_core", "scd_core.__main__", "scd_core.cli", "scd_core.cli_shared", "scd_core.batch_job"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def role(module: str) -> str:
    if module in FRONT:
        return "front"
    if module.startswith("scd_core.models"):
        return "families"
    if module.startswith("scd_core.bench"):
        return "tools"
    return "core"


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The scd_core modules `path` imports (a `from package import name` counts the submodule when it is one)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            submodules = [f"{base}.{alias.name}" for alias in node.names]
            targets = submodules + ([base] if not set(submodules) <= modules else [])
        else:
            continue
        found |= {target for target in targets if target in modules}
    return found - {name}


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    return {name: imports_of(path, set(paths)) for name, path in paths.items()}


ALLOWED = {"core": {"core"}, "families": {"core", "families"}, "tools": {"core", "families", "tools"},
           "front": {"core", "families", "tools", "front"}}


def test_imports_point_from_tools_to_families_to_core():
    wrong = [f"{module} ({role(module)}) imports {target} ({role(target)})"
             for module, targets in sorted(import_graph().items()) for target in sorted(targets)
             if role(target) not in ALLOWED[role(module)]]
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles():
    graph = import_graph()
    # a package's __init__ re-exporting its modules is not a cycle with them
    edges = {module: {t for t in targets if not module.startswith(t + ".")} for module, targets in graph.items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(module: str, stack: list[str]) -> None:
        state[module] = 1
        for target in sorted(edges[module]):
            if state.get(target) == 1:
                cycles.append(" -> ".join(stack[stack.index(target):] + [target]))
            elif target not in state:
                visit(target, stack + [target])
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    assert not cycles, "\n".join(cycles)


def test_the_checker_sees_a_wrong_import(tmp_path):
    """The rule has power: a core module importing a tool is found."""
    probe = PACKAGE / "_layout_probe.py"
    probe.write_text("from .bench import synthetic\n")
    try:
        graph = import_graph()
    finally:
        probe.unlink()
    assert graph["scd_core._layout_probe"] == {"scd_core.bench.synthetic"}
    assert role("scd_core.bench.synthetic") not in ALLOWED[role("scd_core._layout_probe")]
