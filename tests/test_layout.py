"""The layout is part of the design: stages import only earlier stages, and private APIs of
torch, onnxscript, onnx_ir and onnxruntime are touched in ``_compat.py`` alone."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "onnx_modular"

#: Shared leaves: importable from anywhere, importing only other leaves. The package
#: ``leaves`` holds them, except the two that are public (the diagnostics of the pass
#: framework, and the example model the README's first command exports).
LEAVES = {"leaves", "diagnostics", "examples"}
#: Pipeline stages in the order data flows; a stage imports leaves, itself and earlier stages.
STAGES = ["lower", "support", "passes", "emit", "parts", "check", "api", "cli"]
TOP = {"__init__", "__main__"}  # the public surface: may import anything
LIBRARIES = ("torch", "onnxscript", "onnx_ir", "onnxruntime")


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def part_of(module: str) -> str:
    """``onnx_modular.check.validate`` -> ``check``; ``onnx_modular.leaves.io`` -> ``leaves``."""
    parts = module.split(".")[1:]
    return parts[0] if parts else "__init__"


def rank(part: str) -> int:
    if part in LEAVES:
        return -1
    if part in TOP:
        return len(STAGES)
    return STAGES.index(part)


def dotted(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    return ".".join(rel.parts)


def package_imports(tree: ast.AST, module: str) -> list[tuple[int, str]]:
    """(line, imported onnx_modular module) for every import, in functions too."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names
                      if a.name.startswith("onnx_modular")]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative
                base = ".".join(module.split(".")[:-node.level] + ([base] if base else []))
            if not base.startswith("onnx_modular"):
                continue
            if base == "onnx_modular":  # ``from onnx_modular import x``: x may be a module
                found += [(node.lineno, f"onnx_modular.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, base))
    return found


def test_every_module_belongs_to_a_known_part() -> None:
    unknown = {part_of(dotted(p)) for p in modules()} - LEAVES - TOP - set(STAGES)
    assert not unknown, f"modules outside the layout: {unknown}"


def test_the_root_shows_the_stages_and_the_public_api() -> None:
    """No grab bag: beside the stages and ``leaves`` only the public surface."""
    root = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
            if p.suffix == ".py" or (p / "__init__.py").exists()}
    assert root == {*STAGES, *LEAVES, *TOP}


def test_no_module_imports_from_a_later_stage() -> None:
    wrong = []
    for path in modules():
        module = dotted(path)
        mine = part_of(module)
        tree = ast.parse(path.read_text(), str(path))
        for line, imported in package_imports(tree, module):
            theirs = part_of(imported)
            if theirs == "__init__":
                theirs = "api"  # the package root re-exports the api: cli may use it
            if mine in LEAVES and theirs not in LEAVES:
                wrong.append(f"{module}:{line} (a leaf) imports {imported}")
            elif mine not in LEAVES and rank(theirs) > rank(mine):
                wrong.append(f"{module}:{line} ({mine}) imports the later {imported}")
    assert not wrong, "\n".join(wrong)


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports (module level, in functions, and under
    ``TYPE_CHECKING`` alike); ``from pkg import name`` counts as ``pkg`` unless ``name`` is
    a module."""
    known = {dotted(p).removesuffix(".__init__") for p in modules()}
    graph: dict[str, set[str]] = {}
    for path in modules():
        module = dotted(path).removesuffix(".__init__")
        for _, imported in package_imports(ast.parse(path.read_text(), str(path)),
                                           dotted(path)):
            while imported not in known and "." in imported:
                imported = imported.rsplit(".", 1)[0]
            if imported != module:
                graph.setdefault(module, set()).add(imported)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected group of modules (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_no_import_cycles() -> None:
    cycles = import_cycles(import_graph())
    assert not cycles, "modules that import each other, directly or around a circle:\n" + \
        "\n".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_check_catches_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles(graph) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_emit_imports_nothing_from_passes() -> None:
    """The FX passes run before emit (api/ lowers once, then emits): emit takes their
    result (the call chains) as data."""
    wrong = [f"{m} imports {i}" for m, imports in import_graph().items()
             if part_of(m) == "emit" for i in imports if part_of(i) == "passes"]
    assert not wrong, "\n".join(wrong)


def own_private_names() -> set[str]:
    """Every ``_name`` the package itself defines (functions, classes, attributes, args)."""
    names: set[str] = set()
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.alias):
                names.add(node.asname or node.name.split(".")[0])
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def private_uses(tree: ast.AST, own: set[str]) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] in LIBRARIES and any(p.startswith("_") for p in parts):
                    found.append(f"line {node.lineno}: import {a.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            parts = node.module.split(".")
            if parts[0] not in LIBRARIES:
                continue
            if any(p.startswith("_") for p in parts):
                found.append(f"line {node.lineno}: from {node.module} import ...")
            found += [f"line {node.lineno}: from {node.module} import {a.name}"
                      for a in node.names if a.name.startswith("_")]
        elif isinstance(node, ast.Attribute):
            attr = node.attr
            if attr.startswith("_") and not attr.startswith("__") and (
                    attr not in own or _library_chain(node)):
                found.append(f"line {node.lineno}: .{attr}")
    return found


def _library_chain(node: ast.Attribute) -> bool:
    """``torch.utils._pytree.tree_map``: a private part reached from a library's name,
    whatever the package itself calls ``_pytree``."""
    while isinstance(node.value, ast.Attribute):
        node = node.value
    return isinstance(node.value, ast.Name) and node.value.id in LIBRARIES


@pytest.mark.slow
def test_private_apis_are_touched_in_compat_only() -> None:
    own = own_private_names() - private_names_of_compat()
    wrong = []
    for path in modules():
        if path.name == "_compat.py":
            continue
        wrong += [f"{dotted(path)} {use}"
                  for use in private_uses(ast.parse(path.read_text()), own)]
    assert not wrong, "private APIs outside _compat.py:\n" + "\n".join(wrong)


def private_names_of_compat() -> set[str]:
    """Library internals that _compat.py reaches (``_functions``, ``_schema``...): used
    anywhere else they are a breach even though _compat.py 'defines' its own access."""
    tree = ast.parse((PACKAGE / "leaves" / "_compat.py").read_text())
    return {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
            and n.attr.startswith("_") and not n.attr.startswith("__")
            and isinstance(n.ctx, ast.Load)}


@pytest.mark.slow
@pytest.mark.parametrize("source, expected", [
    ("import torch.utils._pytree as p", True),
    ("from torch.onnx._internal.exporter import _core", True),
    ("from onnxruntime.capi import _pybind_state", True),
    ("x = t._version", True),
    ("y = torch.utils._pytree.tree_leaves(x)", True),
    ("import torch\n_pytree = 1\ny = torch.utils._pytree.tree_leaves(x)", True),
    ("x = node.target._schema.returns", True),
    ("class P(InlinePass):\n    def f(self):\n        return self._functions", True),
    ("import torch.export", False),
    ("y = self.__class__", False),
])
def test_the_private_api_check_catches_what_it_should(source: str, expected: bool) -> None:
    own = own_private_names() - private_names_of_compat()
    assert bool(private_uses(ast.parse(source), own)) == expected


#: Stages whose every module has its own test module, ``tests/<stage>/test_<module>.py``.
MIRRORED = ("lower", "support", "passes", "emit", "parts", "check")
#: Modules of those stages still without a test module of their own, each with the reason
#: (keep empty: a new module comes with its test module).
UNMIRRORED: dict[str, str] = {}


def test_every_stage_module_has_its_test_module() -> None:
    tests = Path(__file__).resolve().parent
    missing = []
    for stage in MIRRORED:
        for path in sorted((PACKAGE / stage).rglob("*.py")):
            if path.stem == "__init__":
                continue
            rel = path.relative_to(PACKAGE / stage).with_suffix("")
            name = f"{stage}/{'/'.join(rel.parts)}"
            test = tests / stage / rel.parent / f"test_{rel.name}.py"
            if not test.is_file() and name not in UNMIRRORED:
                missing.append(f"{name} (tests/{test.relative_to(tests)})")
    assert not missing, f"modules without their test module: {missing}"
    stale = [name for name in UNMIRRORED
             if not (PACKAGE / f"{name}.py").is_file()
             or (tests / f"{name.rsplit('/', 1)[0]}/test_{name.rsplit('/', 1)[1]}.py").is_file()]
    assert not stale, f"exceptions no longer needed: {stale}"


#: Functions over ruff's default limits (5 arguments: PLR0913, complexity 10: C901) on
#: 2026-11-27, after the consolidation. pyproject.toml caps how bad one may be; these cap how
#: many there are: lower them when a change removes some, never raise them.
OVER_DEFAULT_LIMITS = {"PLR0913": 22, "C901": 35}
#: Longest function, in lines: longer ones are several jobs.
MAX_FUNCTION_LINES = 80


@pytest.mark.slow  # runs ruff
def test_the_count_of_long_argument_lists_and_complex_functions_cannot_grow() -> None:
    import json
    import subprocess
    import sys

    ruff = subprocess.run(
        [sys.executable, "-m", "ruff", "check", str(PACKAGE), "--select", "PLR0913,C901",
         "--config", "lint.pylint.max-args=5", "--config", "lint.mccabe.max-complexity=10",
         "--output-format", "json", "--exit-zero"], capture_output=True, text=True, check=True)
    found = [f["code"] for f in json.loads(ruff.stdout)]
    counts = {code: found.count(code) for code in OVER_DEFAULT_LIMITS}
    assert all(counts[c] <= OVER_DEFAULT_LIMITS[c] for c in counts), \
        f"{counts}: more functions over ruff's default limits than {OVER_DEFAULT_LIMITS}"


def test_no_function_is_longer_than_the_limit() -> None:
    long = []
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{dotted(path)}.{node.name}: {lines} lines")
    assert not long, "\n".join(long)
