"""The library's layout: each folder of scd_core is a layer, and imports point down, with no circles.

Drawn from the source (every `import` statement, at any depth, so lazy imports count too).  A module may import
its own folder and the layers below its own in LAYERS; layers on one line are siblings and do not import each
other.  bench/ (the measuring tools) may import every layer but the front ends.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "scd_core"
NODES = PACKAGE.parent / "nodes"
README = PACKAGE.parent / "README.md"
ENGINE_LINES = 650    # the bars issue 50 set: engine.py reads as the algorithm ...
LONGEST_FUNCTION = 55  # ... and no function is a feature threaded through flags
# bottom first; a module's layer is its folder under scd_core (models/' own modules are "models"; scd_core's
# top-level modules are named alone)
LAYERS = (
    ("model",),                                         # the adapter protocol
    ("windows", "compiled"),                            # how wide each call is; how a call is made
    ("decoding",),                                      # the exact algorithm
    ("images",),                                        # images in the prompt
    ("models.weights",),                                # safe weights, folders, streaming, quantisation
    ("models.text", "models.tokenizers", "models.sessions"),
    ("models",),                                        # family declarations, loading
    ("models.families",),                               # the seven families
    ("jobs",),                                          # streams of jobs
    ("api",),                                           # scd_core/__init__.py: the library's API
    ("frontends", "bench"),                             # what users run: the CLI; the measuring tools
    ("main",),                                          # scd_core/__main__.py
)
RANK = {layer: rank for rank, names in enumerate(LAYERS) for layer in names}
TOP_MODULES, MODELS_MODULES, LAYOUT_LINES = 8, 10, 30  # issue 60's bars


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> str:
    parts = module.split(".")[1:]
    if not parts:
        return "api"
    if parts == ["__main__"]:
        return "main"
    if parts[0] == "models" and len(parts) > 1:
        return "models." + parts[1] if len(parts) > 2 or (PACKAGE / "models" / parts[1]).is_dir() else "models"
    return parts[0]


def allowed(module: str, target: str) -> bool:
    """Whether `module` may import `target`: its own layer, or one below it (bench: any but the front ends)."""
    mine, theirs = layer(module), layer(target)
    if mine == "bench":
        return theirs not in ("frontends", "main")
    return mine == theirs or RANK[theirs] < RANK[mine]


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


def test_every_module_sits_in_a_known_layer():
    unknown = sorted(module for module in import_graph() if layer(module) not in RANK)
    assert not unknown, f"modules outside LAYERS: {unknown}"


def test_imports_point_down():
    graph = import_graph()
    # a package's __init__ re-exporting its own modules is not an import upwards
    wrong = [f"{module} ({layer(module)}) imports {target} ({layer(target)})"
             for module, targets in sorted(graph.items()) for target in sorted(targets)
             if not target.startswith(module + ".") and not allowed(module, target)]
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
    """The rule has power: a decoding module importing a family, or a family importing a tool, is found."""
    probe = PACKAGE / "decoding" / "_layout_probe.py"
    probe.write_text("from ..models.families import janus\nfrom ..bench import synthetic\n")
    try:
        graph = import_graph()
    finally:
        probe.unlink()
    assert graph["scd_core.decoding._layout_probe"] == {"scd_core.models.families.janus", "scd_core.bench.synthetic"}
    assert not allowed("scd_core.decoding._layout_probe", "scd_core.models.families.janus")
    assert not allowed("scd_core.decoding._layout_probe", "scd_core.bench.synthetic")
    assert not allowed("scd_core.windows.auto_window", "scd_core.compiled.run_calls")  # siblings


def test_the_top_levels_stay_small():
    """scd_core/ and models/ keep at most a few modules beside their folders, and the README's Layout block,
    one line a folder, stays short."""
    top = sorted(path.name for path in PACKAGE.glob("*.py"))
    models = sorted(path.name for path in (PACKAGE / "models").glob("*.py"))
    assert len(top) <= TOP_MODULES, top
    assert len(models) <= MODELS_MODULES, models
    block = re.search(r"## Layout\n.*?```\n(.*?)```", README.read_text(), re.S).group(1)
    assert len(block.splitlines()) <= LAYOUT_LINES
    folders = {path.parent.relative_to(PACKAGE.parent).as_posix() for path in PACKAGE.rglob("__init__.py")}
    assert [folder for folder in sorted(folders) if f"{folder}/" not in block] == []


def test_the_engine_and_every_function_stay_short():
    """engine.py within ENGINE_LINES lines and no function of the package over LONGEST_FUNCTION: a feature that
    needs more arrives as an object in a module of its own."""
    assert len((PACKAGE / "decoding" / "engine.py").read_text().splitlines()) <= ENGINE_LINES
    long = [f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines"
            for path in sorted(PACKAGE.rglob("*.py")) for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > LONGEST_FUNCTION]
    assert not long, "\n".join(long)


def test_settings_go_by_name_and_window_policies_through_their_table():
    """The sampler's settings travel as one named `Sampling` (no positional tuple), a window policy is spelt in
    window_policies.py and the settings' check only, and the loader reads a family through its declared hooks
    (`models.family.hooks`), never by probing the module."""
    sources = {path: path.read_text() for path in [*PACKAGE.rglob("*.py"), *NODES.rglob("*.py")]}
    found = [f"{path.name}: {text!r}" for path, source in sources.items()
             for text in ("self.sampling[", "*self.sampler", "sampler_tensors(*") if text in source]
    found += [f"{path.name}: == AUTO_WINDOW" for path, source in sources.items() if "== AUTO_WINDOW" in source
              and path.name not in ("window_policies.py", "config.py")]
    found += [f"{path.name}: int(window)" for path, source in sources.items()
              if path.is_relative_to(NODES) and "int(window)" in source]
    loading = (PACKAGE / "models" / "loading.py").read_text()
    found += [f"loading.py: {call}(family ...)" for call in ("getattr", "hasattr")
              if f"{call}(family" in loading or f"{call}(module" in loading]
    assert not found, found
