"""Names of the node and function metadata the package writes, and torch.onnx's it reads."""

from __future__ import annotations

from typing import Any

# On every module call node (and on function bodies' nodes after inlining).
META_PATH = "onnx_modular.module_path"
META_TYPE = "onnx_modular.module_type"
META_CALL = "onnx_modular.call_id"
META_FX_OUTPUTS = "onnx_modular.fx_outputs"  # JSON: the FX node of each call output
# On a function: the module call its body was built from.
ORIGIN_PATH = "onnx_modular.origin_path"
ORIGIN_CALL = "onnx_modular.origin_call_id"
# torch.onnx's, on every node it translates.
FX_NODE = "pkg.torch.onnx.fx_node"
NAME_SCOPES = "pkg.torch.onnx.name_scopes"
CLASS_HIERARCHY = "pkg.torch.onnx.class_hierarchy"
STACK_TRACE = "pkg.torch.onnx.stack_trace"
NAMESPACE = "namespace"


def fx_name(node: Any) -> str | None:
    """The FX node an ONNX node was translated from: ``%name : ...`` -> ``name``."""
    text = node.metadata_props.get(FX_NODE)
    if not text or not text.startswith("%"):
        return None
    return text[1:].split(" ", 1)[0]
