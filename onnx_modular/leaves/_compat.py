"""The one seam to private APIs of torch, onnxscript, onnx_ir, onnxruntime and optimum.

Everything here reaches past a library's public surface; nothing else in the package does
(``tests/test_layout.py`` checks). An upgrade that moves one of these is one file's work.
Tested with torch 2.13 and 2.14, onnxscript 0.7, onnx-ir 1.1, onnxruntime 1.32.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import os
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import onnx_ir as ir
import torch
import torch.fx
import torch.utils._pytree as _pytree
from onnx_ir.passes.common import CommonSubexpressionEliminationPass
from onnx_ir.passes.common.inliner import InlinePass

# ---- torch.fx / torch.export -----------------------------------------------------------------

OpOverload = torch._ops.OpOverload
OpOverloadPacket = torch._ops.OpOverloadPacket


def lazy_graph_module(attributes: dict[str, Any], graph: torch.fx.Graph,
                      class_name: str) -> torch.fx.GraphModule:
    """A GraphModule that generates its Python code on first call, not at construction
    (a 48-layer model has hundreds of sub-modules, most never printed)."""
    from torch.fx._lazy_graph_module import _LazyGraphModule

    return _LazyGraphModule(attributes, graph, class_name=class_name)


def generate_code(root: torch.nn.Module, *, recursive: bool = True) -> None:
    """Generate now the code of every lazy graph module under ``root`` (itself included),
    each once: parents first, since a parent's code generation marks its children's code
    for regeneration (a GraphModule's ``recompile`` recurses; building one eager module
    per call instead generates a leaf's code once per ancestor)."""
    from torch.fx._lazy_graph_module import _LazyGraphModule

    for module in root.modules() if recursive else [root]:  # pre-order
        if isinstance(module, _LazyGraphModule):
            module.real_recompile()


def is_persistent_buffer(module: torch.nn.Module, name: str) -> bool:
    """Is buffer ``name`` of ``module`` part of its state dict?"""
    return name not in module._non_persistent_buffers_set


def set_member(module: torch.nn.Module, name: str, value: Any, *, parameter: bool = False,
               buffer: bool = False, persistent: bool = True) -> None:
    """``module.<name> = value`` as a parameter, a (non-)persistent buffer or a plain
    attribute, whatever ``name`` was registered as before (``register_buffer`` refuses a
    name taken by a parameter; ``setattr`` keeps a tensor a buffer)."""
    module._parameters.pop(name, None)
    module._buffers.pop(name, None)
    module._non_persistent_buffers_set.discard(name)
    module.__dict__.pop(name, None)
    if parameter:
        module.register_parameter(name, value)
    elif buffer:
        module.register_buffer(name, value, persistent=persistent)
    else:
        setattr(module, name, value)


def sort_members(module: torch.nn.Module, key: Callable[[str], int]) -> None:
    """Reorder ``module``'s children, parameters and buffers by ``key(name)`` (stable): the
    order ``named_modules`` and ``state_dict`` list them in."""
    for table in (module._modules, module._parameters, module._buffers):
        if len(table) > 1:
            items = sorted(table.items(), key=lambda kv: key(kv[0]))
            table.clear()
            table.update(items)


def codegen_of(graph: torch.fx.Graph) -> Any:
    """The graph's code generator (it carries the pytree calling convention)."""
    return graph._codegen


def set_codegen(graph: torch.fx.Graph, codegen: Any) -> None:
    graph._codegen = codegen


def program_codegen(program: torch.export.ExportedProgram) -> Any:
    """The code generator ``ExportedProgram.module()`` gives its unlifted graph."""
    from torch.export._unlift import _get_codegen

    signature = program.module_call_graph[0].signature
    return _get_codegen(program.call_spec.in_spec, program.call_spec.out_spec,
                        signature.forward_arg_names if signature else None)


def program_guards_fn(program: torch.export.ExportedProgram,
                      module: torch.fx.GraphModule) -> torch.nn.Module | None:
    """The ``_guards_fn`` ``ExportedProgram.module()`` calls on its inputs (shapes, ranges,
    the program's guards), made for ``module``, a graph module with the program's calling
    convention and user-input placeholders; None where ``module()`` would make none."""
    import inspect

    from torch.export import _unlift

    placeholders = module.graph.find_nodes(op="placeholder")
    if not (placeholders and program.example_inputs and _unlift._ok_to_generate_guards_fn()):
        return None
    signature = inspect.signature(module.forward)
    paths = _unlift._get_input_paths(program.example_inputs, signature)
    code = _unlift._get_input_guards_for_graph(placeholders, program.range_constraints, paths)
    extra = _unlift._force_ep_signature_match(getattr(program, "_guards_code", []), paths)
    code.extend(_unlift._force_gm_signature_match(extra, signature))
    return _unlift._convert_guards_code_to_fn(code, paths)


def program_guards(program: torch.export.ExportedProgram) -> list[str]:
    """The conditions torch.export specialized the program under beyond the dimensions'
    ranges (``(L['x'].size()[1] // 8) == 4``: a ``float(x.shape[1] // 8)`` it made a
    constant), as ``ExportedProgram.module()`` checks them; [] where this torch keeps none."""
    return [str(g) for g in getattr(program, "_guards_code", None) or []]


def dim_names(program: torch.export.ExportedProgram) -> dict[str, str]:
    """Symbol -> the name of the ``Dim`` it was made for (``s27`` -> ``batch``), read from
    the shape environment of the program's inputs (torch.export names dimensions ``s<N>``
    and keeps the user's names there only); empty where it holds none."""
    for node in program.graph.nodes:
        value = node.meta.get("val") if node.op == "placeholder" else None
        sizes = [d for d in getattr(value, "shape", ()) if isinstance(d, torch.SymInt)]
        if not sizes:
            continue
        env = sizes[0].node.shape_env
        debug = getattr(env, "source_name_to_debug_name", {})
        names: dict[str, str] = {}
        for symbol, sources in getattr(env, "var_to_sources", {}).items():
            found = {debug[s.name] for s in sources if getattr(s, "name", None) in debug}
            if len(found) == 1:
                names[str(symbol)] = found.pop()
        return names
    return {}


def returns_nothing(target: Any) -> bool:
    """An ATen op whose schema declares no result (``_assert_tensor_metadata``)."""
    return isinstance(target, OpOverload) and not target._schema.returns


def returns_alias(target: Any) -> bool:
    """An operator whose result may be a view of an input (``view``, ``transpose``); True for
    anything that is not an operator overload."""
    schema = getattr(target, "_schema", None)
    return schema is None or any(r.alias_info is not None for r in schema.returns)


def fixed_size(dim: Any, range_constraints: Any) -> int | None:
    """The one value a symbolic dimension can take, where the program's range constraints
    allow each of its symbols a single value (``s39: VR[4, 4]`` makes ``8*s39`` 32); None
    where it may vary (or is no symbolic size)."""
    expr = getattr(getattr(dim, "node", None), "expr", None)
    if expr is None or not isinstance(dim, torch.SymInt):
        return None
    if expr.is_number:
        return int(expr)
    values = {}
    for symbol in expr.free_symbols:
        bounds = range_constraints.get(symbol)
        if bounds is None or bounds.lower != bounds.upper:
            return None
        values[symbol] = bounds.lower
    try:
        return int(expr.subs(values))
    except (TypeError, ValueError):
        return None


def dims_from_names(dynamic_shapes: Any) -> Any:
    """``dynamic_shapes`` with each dimension given as a string (``{0: "batch"}``, which
    torch.onnx takes and torch.export refuses) made ``Dim.DYNAMIC``, as torch.onnx makes
    it; the names go on the file's dimensions afterwards (:func:`names_of_axes`)."""
    from torch.onnx._internal.exporter import _dynamic_shapes

    converted, _ = _dynamic_shapes.convert_str_to_export_dim(dynamic_shapes)
    return converted


def names_of_axes(inputs: Sequence[Any], dynamic_shapes: Any) -> dict[str, str]:
    """Symbol -> the string the user named its input axis with in ``dynamic_shapes``, read
    from the ONNX graph's inputs in order, as torch.onnx renames them (``Dim``\\ s are named
    by :func:`dim_names`); a name given to two symbols torch keeps apart (it could not prove
    them equal) names the first, the others ``<name>_2``, ``<name>_3``..., so the file
    never says two sizes are one. Empty where the inputs and the shapes do not pair up."""
    from torch.onnx._internal.exporter import _dynamic_shapes

    leaves = _pytree.tree_leaves(dynamic_shapes)
    strings = {leaf for leaf in leaves if isinstance(leaf, str)}
    if not strings:
        return {}
    # a renamed axis never takes a name the user gave, as a string or a Dim
    taken = strings | {name for leaf in leaves
                       if isinstance(name := getattr(leaf, "__name__", None), str)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.onnx warns where the counts differ
        try:
            mapping = _dynamic_shapes.create_rename_mapping(list(inputs), dynamic_shapes)
        except Exception:
            return {}
    named: dict[str, str] = {}
    for symbol, name in mapping.items():
        if name not in strings:
            continue
        unique, k = name, 1
        while unique in named.values() or (k > 1 and unique in taken):
            k += 1
            unique = f"{name}_{k}"
        named[symbol] = unique
    return named


def declared_nonzero(dynamic_shapes: Any, program: torch.export.ExportedProgram
                     ) -> frozenset[str]:
    """The symbols (``s72``) of the dimensions the user declared as a ``Dim`` with
    ``min >= 1``: sizes never empty. A range torch narrowed itself (``Dim.AUTO`` and
    ``Dim.DYNAMIC`` start at 2 from its 0/1 specialization) is not the user's word: the
    file still takes a 0 there."""
    declared = {leaf.__name__ for leaf in _pytree.tree_leaves(dynamic_shapes)
                if isinstance(getattr(leaf, "__name__", None), str)
                and isinstance(getattr(leaf, "min", None), int) and leaf.min >= 1}
    return frozenset(symbol for symbol, name in dim_names(program).items()
                     if name in declared)


def alias_arguments(target: Any) -> list[tuple[int, str, bool]] | None:
    """(position, name, written) of each argument an operator's result may share storage
    with or that it writes in place (``Tensor(a!) self``); None for anything that is not an
    operator overload."""
    schema = getattr(target, "_schema", None)
    if schema is None:
        return None
    return [(i, a.name, a.alias_info.is_write) for i, a in enumerate(schema.arguments)
            if a.alias_info is not None]


def qualified_name(target: Any) -> str:
    """``torch.fx``'s dotted name of a Python callable target."""
    return torch.fx.node._get_qualified_name(target)


def tensor_version(tensor: torch.Tensor) -> int:
    """The in-place modification counter of a tensor."""
    return int(tensor._version)


# ---- pytree ----------------------------------------------------------------------------------

tree_flatten = _pytree.tree_flatten
tree_leaves = _pytree.tree_leaves
tree_map = _pytree.tree_map
tree_unflatten = _pytree.tree_unflatten
treespec_dumps = _pytree.treespec_dumps
treespec_loads = _pytree.treespec_loads


def module_in_spec(model: Any) -> Any:
    """The input TreeSpec a graph module with torch.export's calling convention flattens
    its inputs by (``ExportedProgram.module()``, a modularized program); None otherwise."""
    spec = getattr(model, "_in_spec", None) if isinstance(model, torch.fx.GraphModule) else None
    return spec if isinstance(spec, _pytree.TreeSpec) else None


# ---- torch.onnx ------------------------------------------------------------------------------

def _exporter_entry() -> tuple[Callable[..., Any], Callable[..., Any]] | None:
    try:
        from torch.onnx._internal.exporter import _core, _registration
    except ImportError:
        return None
    return _core.export, _registration.ONNXRegistry.from_torchlib


#: torch.onnx's export step and its registry maker, captured at import: an active
#: ``om.hook()`` (which replaces the step) must not apply to our own translations.
_EXPORTER = _exporter_entry()


def default_opset() -> int:
    from torch.onnx import _constants

    return int(_constants.ONNX_DEFAULT_OPSET)


def torchlib_opset() -> int:
    from torch.onnx._internal.exporter import _constants

    return int(_constants.TORCHLIB_OPSET)


@functools.lru_cache(maxsize=4)
def _registry(opset: int) -> Any:
    assert _EXPORTER is not None
    return _EXPORTER[1](opset_version=opset)


_WINDOW_LOCK = threading.Lock()
_window_users = 0
_window_restore: list[Callable[[], None]] = []


@contextlib.contextmanager
def export_window() -> Iterator[None]:
    """Three fixed costs of every export paid once (0.15-0.3 s of a small model's 1-3 s),
    with the same results:

    - torch.onnx builds its decomposition table from the registry's operators on each call;
    - ``run_decompositions`` asks the C++ dispatcher for every CompositeImplicitAutograd
      operator once per operator namespace (about 60 times, 2 ms each) to make each
      reachable as ``torch.ops.<ns>.<op>``, which the first time already did;
    - the translation rebuilds an ONNX operator's signature from its schema for every node
      it writes (half the translation's time; torch.onnx only reads it and copies the
      default attributes it takes).

    (torch.export's passes also regenerate a program's Python code 4-8 times an export;
    torch's switch to generate it on demand is one flag for the whole process, which other
    threads and torch.compile read and set too, and leaves lazy submodules in the programs
    handed on: not used.) Patched while some export here runs (for every thread then; nested
    and concurrent windows share one, restored when the last ends, a failed patch
    included); the tables stay cached for the process."""
    global _window_users
    with _WINDOW_LOCK:
        _window_users += 1
        if _window_users == 1:
            try:
                _window_restore[:] = _patch_fixed_costs()
            except BaseException:  # what was patched is undone there
                _window_users -= 1
                raise
    try:
        yield
    finally:
        with _WINDOW_LOCK:
            _window_users -= 1
            if _window_users == 0:
                for restore in reversed(_window_restore):
                    restore()
                _window_restore.clear()


def _patch_fixed_costs() -> list[Callable[[], None]]:
    """Install what :func:`export_window` patches; what undoes each (only what this torch,
    onnxscript and onnx_ir have is patched; on any other failure what was patched is undone
    before the error goes on)."""
    undo: list[Callable[[], None]] = []
    try:
        _install_fixed_costs(undo)
    except BaseException:
        for restore in reversed(undo):
            restore()
        raise
    return undo


def _install_fixed_costs(undo: list[Callable[[], None]]) -> None:
    """Patch each fixed cost, appending to ``undo`` as it goes."""

    def patch(owner: Any, name: str, value: Any) -> None:
        before = owner.__dict__[name]
        setattr(owner, name, value)
        undo.append(lambda: setattr(owner, name, before))

    try:
        from torch._export import utils as export_utils
        from torch.onnx._internal.exporter import _decomp

        patch(_decomp, "create_onnx_friendly_decomposition_table",
              _cached_table(_decomp.create_onnx_friendly_decomposition_table))
        patch(export_utils, "_materialize_cpp_cia_ops",
              _once_per_export(export_utils._materialize_cpp_cia_ops))
    except (ImportError, AttributeError, KeyError):
        pass
    try:
        import onnx_ir as ir

        make = ir.schemas.OpSignature.__dict__["from_op_schema"].__func__
        patch(ir.schemas.OpSignature, "from_op_schema", classmethod(_cached_signature(make)))
    except (ImportError, AttributeError, KeyError):
        pass


_TABLES: dict[frozenset[Any], dict[Any, Callable[..., Any]]] = {}


def _cached_table(make: Callable[..., dict[Any, Callable[..., Any]]]
                  ) -> Callable[..., dict[Any, Callable[..., Any]]]:
    def table(onnx_registered_ops: set[Any]) -> dict[Any, Callable[..., Any]]:
        key = frozenset(onnx_registered_ops)
        if key not in _TABLES:
            _TABLES[key] = make(onnx_registered_ops)
        return dict(_TABLES[key])  # a copy: the caller may change it
    return table


_SIGNATURES: dict[tuple[str, str, int], Any] = {}


def _cached_signature(make: Callable[..., Any]) -> Callable[..., Any]:
    def signature(cls: type, op_schema: Any) -> Any:
        key = (op_schema.domain, op_schema.name, op_schema.since_version)
        if key not in _SIGNATURES:
            _SIGNATURES[key] = make(cls, op_schema)
        return _SIGNATURES[key]
    return signature


def _once_per_export(materialize: Callable[[], None]) -> Callable[[], None]:
    done = False

    def once() -> None:
        nonlocal done
        if not done:
            materialize()
            done = True
    return once


def torch_onnx_export(program: torch.export.ExportedProgram, opset: int | None,
                      between: Callable[[torch.export.ExportedProgram],
                                        torch.export.ExportedProgram] | None = None) -> Any:
    """``torch.onnx.export(program, optimize=False)``, with torchlib's translation table
    built once per opset (torch.onnx rebuilds it on every call: 0.4 s each).

    ``between(decomposed) -> decomposed`` runs between torch.onnx's two steps,
    decomposition and translation (``lower/repeats.py`` expands repeated calls there)."""
    if _EXPORTER is None:
        if between is not None:
            raise NotImplementedError("this torch.onnx has no separate decomposition step")
        return torch.onnx.export(program, dynamo=True, optimize=False, opset_version=opset,
                                 verbose=False)
    opset = default_opset() if opset is None else opset
    registry = _registry(max(opset, torchlib_opset()))
    if between is None:
        with export_window():
            return _EXPORTER[0](program, registry=registry, optimize=False,
                                opset_version=opset, verbose=False)
    from torch.onnx._internal.exporter import _core

    steps = ("_prepare_exported_program_for_export", "_exported_program_to_onnx_program")
    if not all(hasattr(_core, step) for step in steps):
        raise NotImplementedError("this torch.onnx has no separate decomposition step")
    from torch.onnx._internal._lazy_import import onnxscript_apis

    with export_window():
        prepared = _core._prepare_exported_program_for_export(program, registry=registry)
        decomposed = between(prepared)
        onnx_program = _core._exported_program_to_onnx_program(decomposed, registry=registry)
    onnx_program.model = onnxscript_apis.convert_version(onnx_program.model, opset)
    return onnx_program


def torchlib_onnx_ops(op_name: str) -> frozenset[str] | None:
    """The ONNX op types torchlib's translation of an ATen op emits (``aten.softmax`` ->
    Softmax, Cast, ...), read from the source of its translation functions; ``None`` when
    the op or its translation cannot be found. Used for hints, never for decisions."""
    import ast
    import inspect
    import re
    import textwrap

    if _EXPORTER is None:
        return None
    parts = op_name.split(".")
    try:
        packet = getattr(getattr(torch.ops, parts[0]), parts[1])
        overloads = [parts[2]] if len(parts) > 2 else list(packet.overloads())
        with quiet_loggers("torch.onnx"):  # building it warns about torchvision
            registry = _registry(max(default_opset(), torchlib_opset()))
        functions = [d.onnx_function for o in overloads
                     for d in registry.get_decomps(getattr(packet, o))]
    except Exception:
        return None
    found: set[str] = set()
    seen: set[int] = set()

    def visit(fn: Any, depth: int) -> None:
        fn = getattr(fn, "func", fn)
        if id(fn) in seen or depth > 3 or not callable(fn):
            return
        seen.add(id(fn))
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        except (OSError, TypeError, SyntaxError):
            return
        scope = getattr(inspect.getmodule(fn), "__dict__", {})
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) \
                    and re.fullmatch(r"op\d*", f.value.id):
                found.add(f.attr)
            elif isinstance(f, ast.Name) and f.id.startswith("_"):  # a torchlib helper
                visit(scope.get(f.id), depth + 1)

    for fn in functions:
        visit(fn, 0)
    return frozenset(found) if functions else None


@contextlib.contextmanager
def replaced_torch_onnx_export(make: Callable[[Callable[..., Any]], Callable[..., Any]]
                               ) -> Iterator[None]:
    """Replace the step ``torch.onnx.export(..., dynamo=True)`` builds its program with;
    ``make(original)`` returns the replacement. Restored on exit."""
    from torch.onnx._internal.exporter import _core

    original = _core.export
    _core.export = make(original)
    try:
        yield
    finally:
        _core.export = original


@contextlib.contextmanager
def replaced_torchscript_export(make: Callable[[Callable[..., Any]], Callable[..., Any]]
                                ) -> Iterator[None]:
    """Replace torch.onnx's TorchScript exporter entry: what ``torch.onnx.export(...,
    dynamo=False)`` calls (looked up at each call) and ``torch.onnx.utils.export``."""
    from torch.onnx._internal.torchscript_exporter import utils

    public = importlib.import_module("torch.onnx.utils")
    original = utils.export
    replacement = make(original)
    utils.export = replacement
    rebound = getattr(public, "export", None) is original
    if rebound:
        public.export = replacement
    try:
        yield
    finally:
        utils.export = original
        if rebound:
            public.export = original


def torchscript_defaults() -> dict[str, Any]:
    """The values of the TorchScript exporter's options that change nothing (eval mode,
    plain ONNX operators)."""
    from torch.onnx import OperatorExportTypes, TrainingMode

    return {"eval": TrainingMode.EVAL, "preserve": TrainingMode.PRESERVE,
            "onnx": OperatorExportTypes.ONNX}


#: What torch.export raises where dynamic shapes violate a constraint its guards found.
ExportUserError: type[Exception] = torch._dynamo.exc.UserError


def is_constraint_violation(error: BaseException) -> bool:
    """torch.export's "Constraints violated" (not its other user errors)."""
    kind = getattr(torch._dynamo.exc.UserErrorType, "CONSTRAINT_VIOLATION", None)
    return isinstance(error, ExportUserError) and getattr(error, "error_type", None) == kind


def size_oblivious() -> contextlib.AbstractContextManager[None]:
    """torch.export without specializing dims whose example size is 0 or 1 (a decoder step
    of one token, a batch of one) when they are marked dynamic."""
    from torch.fx.experimental import _config

    return _config.patch(backed_size_oblivious=True)


def verify_onnx_program(onnx_program: Any) -> list[tuple[str, float, float]]:
    """torch.onnx's ``verify=True`` run: ONNX checker, then ONNX Runtime against the program
    on its example inputs; (output name, max abs diff, max rel diff) per output."""
    from torch.onnx._internal._lazy_import import onnxscript_apis
    from torch.onnx._internal.exporter import _verification

    onnxscript_apis.check_model(onnx_program.model)
    return [(r.name, float(r.max_abs_diff), float(r.max_rel_diff))
            for r in _verification.verify_onnx_program(onnx_program)]


# ---- onnxscript --------------------------------------------------------------------------------

def fold_constants_pass() -> Any:
    """onnxscript's constant folder without shape inference, at its default size limits."""
    from onnxscript.optimizer import _constant_folding as folding

    return folding.FoldConstantsPass(
        shape_inference=False,
        input_size_limit=folding.DEFAULT_CONSTANT_FOLD_INPUT_SIZE_LIMIT,
        output_size_limit=folding.DEFAULT_CONSTANT_FOLD_OUTPUT_SIZE_LIMIT)


class _AvoidingRule:
    """A rewrite rule that declines any rewrite whose new nodes include a type in ``avoid``."""

    def __init__(self, rule: Any, avoid: frozenset[str]) -> None:
        self._rule, self._avoid = rule, avoid

    def __getattr__(self, name: str) -> Any:
        return getattr(self._rule, name)

    def try_rewrite(self, *args: Any, **kwargs: Any) -> Any:
        delta = self._rule.try_rewrite(*args, **kwargs)
        if delta is not None and any(n.op_type in self._avoid for n in delta.new_nodes):
            return None
        return delta

    def __repr__(self) -> str:
        return f"Avoiding({self._rule!r}, {sorted(self._avoid)})"


class _KeepingCallsApart(CommonSubexpressionEliminationPass):
    """onnx_ir's common-subexpression pass, leaving local-function calls alone: two module
    calls on one input (``a(x)``, ``b(x)`` of one weightless class) are two calls, as the
    model made them, not one call read twice. Each call carries a distinct temporary
    attribute while the pass runs, so no two compare equal."""

    _TAG = "_onnx_modular_call"

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        calls = [node for node in model.graph if node.op_identifier() in model.functions]
        for k, node in enumerate(calls):
            node.attributes[self._TAG] = ir.AttrInt64(self._TAG, k)
        try:
            return super().call(model)
        finally:
            for node in calls:
                node.attributes.pop(self._TAG, None)


def optimize_ir_keeping_calls(model: ir.Model, avoid: frozenset[str] = frozenset()) -> None:
    """``onnxscript.optimizer.optimize_ir(model, inline=False)``, whose common-subexpression
    step keeps every module call (:class:`_KeepingCallsApart`) and whose rewrite rules
    never make a node of an op type in ``avoid`` (a rule that would is skipped at that match).

    The pass list mirrors onnxscript's ``optimize_ir`` (0.6.2 to 0.7); only those differ.
    """
    import onnxscript.rewriter as rewriter
    from onnx_ir.passes import common as common_passes
    from onnxscript.optimizer import _constant_folding as folding

    rules: Any = rewriter._DEFAULT_REWRITE_RULES
    if avoid:
        rules = rewriter.pattern.RewriteRuleSet(
            [_AvoidingRule(r, avoid) for r in rules])  # type: ignore[misc]
    passes = [
        ir.passes.PassManager([
            folding.FoldConstantsPass(
                shape_inference=True,
                input_size_limit=folding.DEFAULT_CONSTANT_FOLD_INPUT_SIZE_LIMIT,
                output_size_limit=folding.DEFAULT_CONSTANT_FOLD_OUTPUT_SIZE_LIMIT,
                should_fold=lambda node: None),
            rewriter.RewritePass(rules),
            common_passes.RemoveUnusedNodesPass(),
            common_passes.RemoveUnusedFunctionsPass(),
            common_passes.RemoveUnusedOpsetsPass(),
        ], steps=2, early_stop=True),
        common_passes.RemoveUnusedNodesPass(),
        common_passes.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0),
        common_passes.LiftSubgraphInitializersToMainGraphPass(),
        common_passes.DeduplicateInitializersPass(),
        _KeepingCallsApart(),
        common_passes.OutputFixPass(),
        common_passes.NameFixPass(),
    ]
    ir.passes.Sequential(*passes)(model)


#: The logger the folder warns on for every node its reference evaluator cannot evaluate.
FOLDING_LOGGER = "onnxscript.optimizer._constant_folding"


@contextlib.contextmanager
def quiet_loggers(*names: str) -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


#: The libraries whose loggers, prints and warnings a capture or translation silences.
QUIET_LIBRARIES = ("torch", "onnxscript", "onnx_ir", "onnx")


class _MutedInThread:
    """A stand-in for ``sys.stdout``/``sys.stderr`` that drops what one thread writes and
    passes every other thread's writes on (a progress spinner keeps spinning)."""

    def __init__(self, stream: Any, thread: int) -> None:
        self._stream = stream
        self._thread = thread

    def write(self, text: str) -> int:
        if threading.get_ident() == self._thread:
            return len(text)
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def quiet_libraries() -> Iterator[None]:
    """Nothing from torch, onnxscript or onnx reaches the terminal while this runs.

    torch.export prints the partial graph to stderr when it fails (``_log_export_wrapper``),
    symbolic shapes log warnings through torch's own handler, the exportdb logs an error,
    torch.onnx prints progress; user code under trace warns. The caller reports failures as
    one line and success as its summary, so these would only come first. Loggers of the
    libraries are disabled (new ones inherit a level above CRITICAL), warnings ignored,
    and this thread's writes to stdout/stderr dropped.
    """
    manager = logging.Logger.manager
    loggers = [logger for name, logger in list(manager.loggerDict.items())
               if isinstance(logger, logging.Logger)
               and any(name == lib or name.startswith(lib + ".") for lib in QUIET_LIBRARIES)]
    disabled = [logger.disabled for logger in loggers]
    tops = [logging.getLogger(lib) for lib in QUIET_LIBRARIES]
    levels = [logger.level for logger in tops]
    for logger in loggers:
        logger.disabled = True
    for logger in tops:
        logger.setLevel(logging.CRITICAL + 1)
    thread = threading.get_ident()
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _MutedInThread(out, thread), _MutedInThread(err, thread)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        sys.stdout, sys.stderr = out, err
        for logger, level in zip(tops, levels, strict=True):
            logger.setLevel(level)
        for logger, was in zip(loggers, disabled, strict=True):
            logger.disabled = was


# ---- onnx_ir ---------------------------------------------------------------------------------

class ObservedInlinePass(InlinePass):
    """onnx_ir's inliner, telling a subclass about every call it expands.

    ``expanded(call, function, nodes)`` sees the call node, its function and the nodes that
    replace it (their labels may be changed there); ``function_of(node)`` looks a call up.
    """

    def expanded(self, call: ir.Node, function: ir.Function, nodes: list[ir.Node]) -> None:
        """Hook for subclasses; does nothing by default."""

    def function_of(self, node: ir.Node) -> ir.Function | None:
        return self._functions.get(node.op_identifier())

    def _instantiate_call(self, node: ir.Node, call_site_id: str) -> Any:  # type: ignore[override]
        self.before_expand(node)
        nodes, values = super()._instantiate_call(node, call_site_id)
        self.expanded(node, self._functions[node.op_identifier()], nodes)
        _detach_inputs(node)
        return nodes, values

    def before_expand(self, call: ir.Node) -> None:
        """Hook for subclasses: ``call`` is about to be expanded."""


def _detach_inputs(node: ir.Node) -> None:
    """Drop every input of a call node about to be removed, in one pass: onnx_ir's removal
    rebuilds the input tuple once per input, quadratic in a call that takes every weight of
    the model (GPT-2's top call: 300 inputs)."""
    for index, value in enumerate(node.inputs):
        if value is not None:
            value._remove_usage(node, index)
    node._inputs = ()


# ---- onnxruntime -----------------------------------------------------------------------------

@functools.cache
def ort_kernel_defs() -> tuple[Any, ...]:
    """Every kernel the installed onnxruntime registers, for every execution provider."""
    from onnxruntime.capi import _pybind_state

    return tuple(_pybind_state.get_all_opkernel_def())


@functools.cache
def ort_contrib_operator_names() -> frozenset[str]:
    """Names of the ``com.microsoft`` operators the installed onnxruntime defines (none when
    this build lists no schemas)."""
    try:
        from onnxruntime.capi import _pybind_state

        schemas = _pybind_state.get_all_operator_schema()
    except (ImportError, AttributeError, RuntimeError):
        return frozenset()
    return frozenset(s.name for s in schemas if s.domain == "com.microsoft")


@functools.cache
def ort_operator_domains() -> frozenset[str]:
    """Every operator domain the installed onnxruntime defines kernels' schemas for."""
    try:
        from onnxruntime.capi import _pybind_state

        return frozenset(s.domain for s in _pybind_state.get_all_operator_schema())
    except (ImportError, AttributeError, RuntimeError):
        return frozenset({"", "ai.onnx.ml", "com.microsoft"})


@functools.cache
def _ir_save_parameters() -> frozenset[str]:
    import inspect

    return frozenset(inspect.signature(ir.save).parameters)


def ir_save_external(model: ir.Model, path: str | os.PathLike[str], data_name: str) -> None:
    """``ir.save`` with external data, two writer threads and large weights at 64 KiB
    offsets (for ONNX Runtime's mapping of external data, which older releases of it
    required) where the installed onnx_ir has those options (1.1); earlier releases write
    serially and align by default.

    Two threads overlap one weight's copy (a folded transpose) with another's write: 4.4 GB
    in ~4 s instead of ~15 s on this machine's disk (``scripts/bench_scale.py``).
    """
    options: dict[str, Any] = {}
    if {"max_workers", "alignment"} <= _ir_save_parameters():
        options = {"max_workers": 2, "alignment": 64 * 1024}
    ir.save(model, path, external_data=data_name, **options)


# ---- transformers ------------------------------------------------------------------------------

def has_transformers_init(module: Any) -> bool:
    """A transformers ``PreTrainedModel``: it initializes (and computes) its tensors itself."""
    return callable(getattr(module, "_init_weights", None)) and hasattr(module, "config")


def transformers_init_weights(owner: Any, module: Any) -> None:
    """``owner._init_weights(module)``: transformers' per-module initialization, which also
    computes non-persistent buffers (rotary ``inv_freq``) from the config."""
    owner._init_weights(module)


# ---- onnxruntime's quantizers and transformers optimizer ---------------------------------------

@contextlib.contextmanager
def _replaced_attribute(owner: Any, name: str, make: Callable[[Any], Any]) -> Iterator[None]:
    original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
    setattr(owner, name, make(original))
    try:
        yield
    finally:
        setattr(owner, name, original)


def _saving_through(saving: Callable[[Any, str], Callable[[str], None] | None], tool: str
                    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A ``save_model_to_file(self, output_path, ...)`` that asks ``saving(self.model, tool)``
    first and hands the written path to what it returns."""
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def save_model_to_file(self: Any, output_path: Any, *args: Any, **kwargs: Any) -> Any:
            finish = saving(self.model, tool)
            result = original(self, output_path, *args, **kwargs)
            if finish is not None:
                finish(os.fspath(output_path))
            return result
        return save_model_to_file
    return make


@contextlib.contextmanager
def replaced_ort_quantization(prepare: Callable[[Any], Any],
                              saving: Callable[[Any, str], Callable[[str], None] | None]
                              ) -> Iterator[None]:
    """ONNX Runtime's quantizers, seen where every entry passes (``quantize_dynamic``,
    ``quantize_static``, ``quantize``, Optimum's ``ORTQuantizer``): classes and a module
    global looked up at each call, so a function imported before still goes through them.

    The ``ModelProto`` a quantizer (``BaseQuantizer``: ``ONNXQuantizer``, ``QDQQuantizer``)
    or a calibrator (``CalibraterBase``) is given, and the one ``quantize_static``/
    ``quantize_dynamic`` update the opset of (the version converter drops local functions),
    goes through ``prepare(proto) -> proto``; ``ONNXModel.save_model_to_file`` asks
    ``saving(proto, "quantized")`` first and calls what it returns with the written path.
    """
    from onnxruntime.quantization import base_quantizer, calibrate, onnx_model, quant_utils
    from onnxruntime.quantization import quantize as quantize_module

    def quantizer_init(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def __init__(self: Any, model: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807
            original(self, prepare(model), *args, **kwargs)
        return __init__

    def calibrator_init(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807
            original(self, *args, **kwargs)
            prepared = prepare(self.model)
            if prepared is not self.model:  # shapes of the inlined values, as ORT loads it
                self.model = quant_utils.save_and_reload_model_with_shape_infer(prepared)
        return __init__

    def opset_update(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def update_opset_version(model: Any, *args: Any, **kwargs: Any) -> Any:
            return original(prepare(model), *args, **kwargs)
        return update_opset_version

    with contextlib.ExitStack() as stack:
        stack.enter_context(_replaced_attribute(base_quantizer.BaseQuantizer, "__init__",
                                                quantizer_init))
        stack.enter_context(_replaced_attribute(calibrate.CalibraterBase, "__init__",
                                                calibrator_init))
        if hasattr(quantize_module, "update_opset_version"):
            stack.enter_context(_replaced_attribute(quantize_module, "update_opset_version",
                                                    opset_update))
        stack.enter_context(_replaced_attribute(onnx_model.ONNXModel, "save_model_to_file",
                                                _saving_through(saving, "quantized")))
        yield


@contextlib.contextmanager
def replaced_transformers_optimizer(
        prepare: Callable[[Any], Any],
        prepare_source: Callable[[Any], tuple[Any, Callable[[str | None], None]] | None],
        saving: Callable[[Any, str], Callable[[str], None] | None]) -> Iterator[None]:
    """ONNX Runtime's transformers optimizer (``optimize_model``, Optimum's ``ORTOptimizer``)
    where every run passes: ``optimize_by_onnxruntime`` (a module global ``optimize_model``
    looks up at each call) gets ``prepare_source(model)``'s source instead of its own, and
    the callback that came with it gets the file it wrote (None when it wrote none); the
    ``ModelProto`` an ``OnnxModel`` (every fusion optimizer) wraps goes through ``prepare``; its
    ``save_model_to_file`` asks ``saving(proto, "optimized")`` first. Nothing happens where
    the optimizer cannot be imported."""
    try:
        from onnxruntime.transformers import optimizer
    except Exception:  # an ORT build without its transformers tools
        yield
        return

    def by_onnxruntime(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def optimize_by_onnxruntime(onnx_model: Any = None, *args: Any, **kwargs: Any) -> Any:
            prepared = prepare_source(onnx_model) if onnx_model is not None else None
            if prepared is None:
                return original(onnx_model, *args, **kwargs)
            source, written = prepared
            result = None
            try:
                result = original(source, *args, **kwargs)
            finally:  # None: it failed or wrote nothing (no GPU: the source came back)
                written(result if isinstance(result, str) and result != source else None)
            return result
        return optimize_by_onnxruntime

    def model_init(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def __init__(self: Any, model: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807
            original(self, prepare(model), *args, **kwargs)
        return __init__

    with contextlib.ExitStack() as stack:
        stack.enter_context(_replaced_attribute(optimizer, "optimize_by_onnxruntime",
                                                by_onnxruntime))
        stack.enter_context(_replaced_attribute(optimizer.OnnxModel, "__init__", model_init))
        stack.enter_context(_replaced_attribute(optimizer.OnnxModel, "save_model_to_file",
                                                _saving_through(saving, "optimized")))
        yield


# ---- optimum ---------------------------------------------------------------------------------

#: Optimum's module of ``merge_decoders`` (``decoder_model_merged.onnx``).
_OPTIMUM_MERGE = "optimum.onnx.graph_transformations"
#: This thread's ``finish`` from the merge under way (``replaced_optimum_decoder_merge``).
_merge_under_way = threading.local()


def optimum_merge_imported() -> bool:
    """Has this process imported Optimum's decoder merge? (Importing it here would import
    transformers, seconds, for every hook.)"""
    return _OPTIMUM_MERGE in sys.modules


def _is_optimum_merged(model: Any) -> bool:
    """The model ``merge_decoders`` builds: one ``If`` of the two decoders' graphs."""
    graph = getattr(model, "graph", None)
    return graph is not None and len(graph.node) == 1 and graph.node[0].op_type == "If"


@contextlib.contextmanager
def replaced_optimum_decoder_merge(
        merging: Callable[[Any, Any], Callable[[Any], Callable[[str], None] | None] | None]
        ) -> Iterator[None]:
    """Optimum's ``merge_decoders`` where every call passes, however the function was
    imported: the module globals it looks up at each call. Its first step with both decoders
    loaded, ``_unify_onnx_outputs(decoder, decoder_with_past, ...)``, first asks
    ``merging(decoder, decoder_with_past)`` (which may change both in place) for a ``finish``;
    ``check_and_save_model`` of the merged ``If`` model it builds then calls
    ``finish(merged)`` (which may change it in place) before checking and saving it, and
    what that returns with the saved path. Nothing happens where the module was not
    imported, or no longer has these steps."""
    module = sys.modules.get(_OPTIMUM_MERGE)
    if module is None or not all(hasattr(module, name) for name in
                                 ("merge_decoders", "_unify_onnx_outputs",
                                  "check_and_save_model")):
        yield
        return

    def unify(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def _unify_onnx_outputs(model1: Any, model2: Any, *args: Any, **kwargs: Any) -> Any:
            _merge_under_way.finish = merging(model1, model2)
            return original(model1, model2, *args, **kwargs)
        return _unify_onnx_outputs

    def check_and_save(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def check_and_save_model(model: Any, save_path: Any, *args: Any, **kwargs: Any) -> Any:
            finish = getattr(_merge_under_way, "finish", None)
            if finish is None or not _is_optimum_merged(model):
                return original(model, save_path, *args, **kwargs)
            _merge_under_way.finish = None
            saved = finish(model)
            result = original(model, save_path, *args, **kwargs)
            if saved is not None and save_path is not None:
                saved(os.fspath(save_path))
            return result
        return check_and_save_model

    with contextlib.ExitStack() as stack:
        stack.enter_context(_replaced_attribute(module, "_unify_onnx_outputs", unify))
        stack.enter_context(_replaced_attribute(module, "check_and_save_model",
                                                check_and_save))
        try:
            yield
        finally:
            _merge_under_way.finish = None
