"""Compare two ONNX models: structure after inlining, numerics on the same inputs, cost.

A hierarchical model and its flat twin should inline to the same graph and compute the same
values; ``compare`` shows both, plus file size and ONNX Runtime session and run time.
Equivalence is numerical (same input signature, outputs within tolerance); the structural
figures (op histogram, node count, a topology hash that ignores names) say *where* two
equivalent models differ in shape, or confirm they do not.
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import hashlib
import operator
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
from onnx_ir.passes.common.inliner import InlinePass

from onnx_modular import runtime as _ort
from onnx_modular.check.report import Report
from onnx_modular.diagnostics import DiagnosticContext, OnnxModularError
from onnx_modular.errors import rules

__all__ = ["CompareReport", "ModelFacts", "OutputDiff", "compare", "random_inputs",
           "run_compare", "topology_hash"]

#: The size a dynamic dimension gets in generated inputs.
DEFAULT_DIM = 4


def _error(reason: str) -> OnnxModularError:
    return DiagnosticContext().error(rules.BAD_INPUT, reason=reason)


# ---- structure -------------------------------------------------------------------------------

def _h(*parts: Any) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


def _attr_key(attr: ir.Attr) -> Any:
    kind = attr.type
    if kind == ir.AttributeType.TENSOR:
        t = attr.as_tensor()
        return ("tensor", str(t.dtype), tuple(t.shape), hashlib.sha256(t.tobytes()).hexdigest())
    if kind == ir.AttributeType.TENSORS:
        return tuple(("tensor", str(t.dtype), tuple(t.shape),
                      hashlib.sha256(t.tobytes()).hexdigest()) for t in attr.as_tensors())
    if kind == ir.AttributeType.GRAPH:
        return ("graph", _graph_hash(attr.as_graph()))
    if kind == ir.AttributeType.GRAPHS:
        return tuple(("graph", _graph_hash(g)) for g in attr.as_graphs())
    return (kind.name, repr(attr.value))


#: Constants up to this many elements enter the topology hash by value (shapes, axes,
#: scalars); larger ones (weights) by dtype and shape only.
SMALL_CONSTANT = 16


def _array_key(array: np.ndarray) -> str:
    data = hashlib.sha256(array.tobytes()).hexdigest() if array.size <= SMALL_CONSTANT else ""
    return _h("constant", str(array.dtype), tuple(array.shape), data)


def _initializer_key(value: ir.Value) -> str:
    tensor = value.const_value
    if tensor is None:
        return _h("initializer", str(value.dtype), value.shape and tuple(value.shape))
    if tensor.size <= SMALL_CONSTANT:
        return _array_key(tensor.numpy())
    return _h("constant", str(np.dtype(tensor.dtype.numpy())), tuple(tensor.shape), "")


def _constant_key(node: ir.Node) -> str | None:
    """A Constant node's value, keyed as an initializer holding it would be."""
    if len(node.attributes) != 1:
        return None
    (name, attr), = node.attributes.items()
    scalars = {"value_float": np.float32, "value_int": np.int64,
               "value_floats": np.float32, "value_ints": np.int64}
    if name == "value":
        return _array_key(attr.as_tensor().numpy())
    if name in scalars:
        return _array_key(np.asarray(attr.value, dtype=scalars[name]))
    return None


def _graph_hash(graph: ir.Graph) -> str:
    """Hash of op types, attributes and wiring; value and node names do not enter.

    A Constant node hashes like the initializer it could be folded to and an Identity
    passes its input's key on, so a model and its constant-folded twin hash alike.
    """
    key: dict[ir.Value, str] = {}
    for i, value in enumerate(graph.inputs):
        key[value] = _h("input", i, str(value.dtype), value.shape and len(value.shape))
    for value in graph.initializers.values():
        if value not in key:
            key[value] = _initializer_key(value)
    node_keys = []
    for node in graph:
        if node.domain in ("", "ai.onnx") and node.op_type == "Identity" and node.inputs:
            source = node.inputs[0]
            key[node.outputs[0]] = key.get(source, "outer") if source is not None else "none"
            continue
        if node.domain in ("", "ai.onnx") and node.op_type == "Constant":
            constant = _constant_key(node)
            if constant is not None:
                key[node.outputs[0]] = constant
                continue
        attrs = tuple(sorted((name, _attr_key(a)) for name, a in node.attributes.items()))
        inputs = tuple(key.get(v, "outer") if v is not None else "none" for v in node.inputs)
        nk = _h(node.domain, node.op_type, attrs, inputs)
        node_keys.append(nk)
        for k, out in enumerate(node.outputs):
            key[out] = _h(nk, k)
    outputs = tuple(key.get(v, "outer") for v in graph.outputs)
    return _h(outputs, tuple(sorted(node_keys)))


def topology_hash(model: onnx.ModelProto) -> str:
    """The name-free structural hash of ``model`` after inlining every local function."""
    return _graph_hash(_inlined(model).graph)


def _inlined(model: onnx.ModelProto) -> ir.Model:
    m = ir.serde.deserialize_model(model)
    if m.functions:
        InlinePass()(m)
    return m


@dataclasses.dataclass
class ModelFacts:
    """What one model is: size, structure (before and after inlining), ORT cost."""

    label: str
    size_bytes: int
    functions: int
    nodes: int  # main graph + every function body, as stored
    inlined_nodes: int
    op_histogram: dict[str, int]
    topology: str
    session_s: float = 0.0
    run_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _facts(loaded: _ort.LoadedModel) -> ModelFacts:
    proto = loaded.proto
    stored = len(proto.graph.node) + sum(len(f.node) for f in proto.functions)
    try:
        model = _inlined(proto)
    except Exception as exc:
        raise _error(f"cannot inline ONNX model {loaded.label}: "
                     f"{_ort._first_line(exc)}") from None
    histogram = collections.Counter(
        f"{n.domain}::{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type
        for n in model.graph.all_nodes())
    return ModelFacts(loaded.label, loaded.size_bytes, len(proto.functions), stored,
                      sum(histogram.values()), dict(sorted(histogram.items())),
                      _graph_hash(model.graph))


# ---- inputs ----------------------------------------------------------------------------------

def _dim_value(dim: onnx.TensorShapeProto.Dimension, symbols: dict[str, int]) -> int:
    if dim.HasField("dim_value"):
        return dim.dim_value
    text = dim.dim_param if dim.HasField("dim_param") else ""
    if not text:
        return DEFAULT_DIM
    if text.isidentifier():
        return symbols.setdefault(text, DEFAULT_DIM)
    try:  # torch writes expressions such as "s0 + 1" or "2*s1"
        return max(1, int(_eval_dim(ast.parse(text, mode="eval").body, symbols)))
    except (SyntaxError, ValueError, TypeError, ZeroDivisionError):
        return DEFAULT_DIM


_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.FloorDiv: operator.floordiv, ast.Div: operator.floordiv, ast.Mod: operator.mod}


def _eval_dim(node: ast.AST, symbols: dict[str, int]) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.Name):
        return symbols.setdefault(node.id, DEFAULT_DIM)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _BINOPS[type(node.op)](_eval_dim(node.left, symbols),
                                      _eval_dim(node.right, symbols))
    raise ValueError(ast.dump(node))


def _graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    initializers = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in initializers]


def random_inputs(model: onnx.ModelProto, seed: int = 0,
                  other: onnx.ModelProto | None = None) -> dict[str, np.ndarray]:
    """Inputs from the declared types and shapes; dynamic dims get ``DEFAULT_DIM``.

    A dimension dynamic in ``model`` but static in ``other`` takes ``other``'s size, so one
    set of inputs fits both. Floats are standard normal; integers are 0 or 1 (valid
    indices, masks and ids alike).
    """
    rng = np.random.default_rng(seed)
    twins = _graph_inputs(other) if other is not None else []
    symbols: dict[str, int] = {}
    feeds = {}
    for k, info in enumerate(_graph_inputs(model)):
        if not info.type.HasField("tensor_type"):
            raise _error(f"input '{info.name}' is not a tensor; give inputs explicitly")
        ttype = info.type.tensor_type
        twin = list(twins[k].type.tensor_type.shape.dim) if k < len(twins) else []
        shape = []
        for d, dim in enumerate(ttype.shape.dim):
            if not dim.HasField("dim_value") and d < len(twin) and twin[d].HasField("dim_value"):
                dim = twin[d]
            shape.append(_dim_value(dim, symbols))
        np_type = onnx.helper.tensor_dtype_to_np_dtype(ttype.elem_type)
        if np.issubdtype(np_type, np.floating) or _ort.onnx_elem_name(ttype.elem_type) in (
                "bfloat16",) or "float8" in str(np_type):
            feeds[info.name] = rng.standard_normal(shape).astype(np_type)
        elif np_type == np.bool_:
            feeds[info.name] = rng.integers(0, 2, shape).astype(np.bool_)
        else:
            feeds[info.name] = rng.integers(0, 2, shape).astype(np_type)
    return feeds


def _to_numpy(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor; avoid importing torch for numpy users
        from onnx_modular.check.validate import to_feed

        return to_feed(value)
    return np.asarray(value)


def _feeds(model: onnx.ModelProto, inputs: Any,
           other: onnx.ModelProto | None = None) -> dict[str, np.ndarray]:
    names = [i.name for i in _graph_inputs(model)]
    if inputs is None:
        return random_inputs(model, other=other)
    if isinstance(inputs, Mapping):
        missing = [n for n in names if n not in inputs]
        if missing:
            raise _error(f"inputs lack {', '.join(missing)} (the models take {', '.join(names)})")
        return {n: _to_numpy(inputs[n]) for n in names}
    if not isinstance(inputs, Sequence) or isinstance(inputs, (str, bytes)):
        inputs = (inputs,)
    if len(inputs) != len(names):
        raise _error(f"the models take {len(names)} input(s) ({', '.join(names)}) but "
                     f"{len(inputs)} were given")
    return {n: _to_numpy(v) for n, v in zip(names, inputs, strict=True)}


def _signature(model: onnx.ModelProto) -> list[tuple[str, int]]:
    return [(_ort.onnx_elem_name(i.type.tensor_type.elem_type), len(i.type.tensor_type.shape.dim))
            for i in _graph_inputs(model)]


# ---- the report ------------------------------------------------------------------------------

@dataclasses.dataclass
class OutputDiff:
    index: int
    name_a: str
    name_b: str
    dtype: str
    rtol: float
    atol: float
    diff: _ort.Diff

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "name_a": self.name_a, "name_b": self.name_b,
                "dtype": self.dtype, "rtol": self.rtol, "atol": self.atol,
                **self.diff.to_dict()}


@dataclasses.dataclass
class CompareReport(Report):
    """Two models side by side; ``equivalent`` is numerical, ``same_structure`` structural."""

    a: ModelFacts
    b: ModelFacts
    outputs: list[OutputDiff]
    provider: str
    reasons: list[str]

    @property
    def equivalent(self) -> bool:
        return not self.reasons and all(o.diff.ok for o in self.outputs)

    @property
    def same_structure(self) -> bool:
        return self.a.topology == self.b.topology

    @property
    def exit_code(self) -> int:
        return 0 if self.equivalent else 1

    def to_dict(self) -> dict[str, Any]:
        return {"equivalent": self.equivalent, "same_structure": self.same_structure,
                "provider": self.provider, "reasons": self.reasons,
                "a": self.a.to_dict(), "b": self.b.to_dict(),
                "outputs": [o.to_dict() for o in self.outputs]}

    def summary(self) -> str:
        if self.equivalent:
            shape = "same structure" if self.same_structure else "different structure"
            return f"EQUIVALENT ({shape} after inlining)"
        bad = [f"output #{o.index} ({o.name_a}: max abs err {o.diff.max_abs:.3g})"
               for o in self.outputs if not o.diff.ok]
        return "DIFFERENT: " + "; ".join(self.reasons + bad)

    def _fact_rows(self) -> list[list[str]]:
        a, b = self.a, self.b
        ops = sorted(set(a.op_histogram) | set(b.op_histogram))
        rows = [
            ["file size", f"{a.size_bytes:,} B", f"{b.size_bytes:,} B"],
            ["functions", str(a.functions), str(b.functions)],
            ["nodes (stored)", str(a.nodes), str(b.nodes)],
            ["nodes (inlined)", str(a.inlined_nodes), str(b.inlined_nodes)],
            ["topology hash", a.topology[:12], b.topology[:12]],
            ["ORT session (ms)", f"{a.session_s * 1e3:.1f}", f"{b.session_s * 1e3:.1f}"],
            ["ORT run (ms)", f"{a.run_s * 1e3:.2f}", f"{b.run_s * 1e3:.2f}"],
        ]
        rows += [[f"  {op}", str(a.op_histogram.get(op, 0)), str(b.op_histogram.get(op, 0))]
                 for op in ops if a.op_histogram.get(op, 0) != b.op_histogram.get(op, 0)]
        return rows

    def _output_rows(self) -> list[list[str]]:
        return [[str(o.index), o.name_a, o.name_b, o.dtype, f"{o.diff.max_abs:.3g}",
                 f"{o.diff.max_rel:.3g}", "ok" if o.diff.ok else "FAIL", o.diff.note]
                for o in self.outputs]

    _OUT_HEAD = ["#", "output (a)", "output (b)", "dtype", "max abs err", "max rel err",
                 "status", "note"]

    def __rich__(self) -> Any:
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        facts = Table(title="Structure and cost", title_justify="left")
        facts.add_column("")
        facts.add_column(f"a: {self.a.label}", justify="right")
        facts.add_column(f"b: {self.b.label}", justify="right")
        for row in self._fact_rows():
            facts.add_row(*row)
        outs = Table(title=f"Outputs on {_ort.short_provider(self.provider)}",
                     title_justify="left")
        for h in self._OUT_HEAD:
            outs.add_column(h)
        for row in self._output_rows():
            outs.add_row(*row)
        return Group(facts, outs, Text(self.summary(),
                                       style="green" if self.equivalent else "bold red"))

    def to_markdown(self) -> str:
        from onnx_modular.check.validate import _md_table

        lines = [f"# Compare {self.a.label} and {self.b.label}", "", f"**{self.summary()}**", ""]
        lines += [*_md_table(["", "a", "b"], self._fact_rows()), ""]
        lines += _md_table(self._OUT_HEAD, self._output_rows())
        return "\n".join(lines) + "\n"


# ---- compare ---------------------------------------------------------------------------------

def compare(a: Any, b: Any, inputs: Any = None, *, provider: str = "cpu",
            rtol: float | None = None, atol: float | None = None) -> CompareReport:
    """Compare ONNX models ``a`` and ``b`` (paths, ModelProtos or export results).

    ``inputs``: None (random, from ``a``'s declared inputs), a sequence in input order, or a
    mapping by input name; numpy arrays or torch tensors.
    """
    la, lb = _ort.load_model(a, "model a"), _ort.load_model(b, "model b")
    (chosen,) = _ort.resolve_providers([provider])
    fa, fb = _facts(la), _facts(lb)
    reasons: list[str] = []
    sig_a, sig_b = _signature(la.proto), _signature(lb.proto)
    if sig_a != sig_b:
        reasons.append(f"input signatures differ: {sig_a} vs {sig_b}")
    outs_a = [o.name for o in la.proto.graph.output]
    outs_b = [o.name for o in lb.proto.graph.output]
    if len(outs_a) != len(outs_b):
        reasons.append(f"output counts differ: {len(outs_a)} vs {len(outs_b)}")
    diffs: list[OutputDiff] = []
    if not reasons:
        feeds = _feeds(la.proto, inputs, lb.proto)
        values = []
        for which, loaded, facts in (("a", la, fa), ("b", lb, fb)):
            session, facts.session_s = _ort.make_session(loaded.session_source(), chosen)
            names = [i.name for i in session.get_inputs()]
            feed = dict(zip(names, feeds.values(), strict=True))
            try:
                out, facts.run_s = _ort.run_session(session, feed)
            except OnnxModularError as exc:
                raise _error(f"model {which} ({loaded.label}): "
                             f"{exc.diagnostic.message}") from None
            values.append(out)
        for i, (x, y) in enumerate(zip(*values, strict=True)):
            dtype = _ort.dtype_name(np.asarray(x))
            r, t = _ort.tolerances_for(dtype, rtol, atol)
            d = _ort.diff(y, x, r, t)
            if _ort.dtype_name(np.asarray(y)) != dtype and d.ok:
                d = dataclasses.replace(d, ok=False,
                                        note=f"dtype {_ort.dtype_name(np.asarray(y))} != {dtype}")
            diffs.append(OutputDiff(i, outs_a[i], outs_b[i], dtype, r, t, d))
    return CompareReport(fa, fb, diffs, chosen, reasons)


def run_compare(a: Any, b: Any, inputs: Any = None, *, report: str | Path | None = None,
                console: Any = None, rtol: float | None = None,
                atol: float | None = None) -> int:
    """For the command line: print the comparison; 0 equivalent, 1 different, 2 error."""
    from rich.console import Console
    from rich.text import Text

    console = console or Console()
    try:
        rep = compare(a, b, inputs, rtol=rtol, atol=atol)
        console.print(rep)
        if report is not None:
            rep.save(report)
    except OnnxModularError as exc:
        console.print(Text(str(exc), style="bold red"), soft_wrap=True)
        return 2
    return rep.exit_code
