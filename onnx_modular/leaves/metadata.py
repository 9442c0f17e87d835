"""Every metadata key the package writes or reads, ONNX and FX, and the call record.

ONNX: ``metadata_props`` of call nodes and functions (ours) and of translated nodes
(torch.onnx's). FX: ``node.meta`` keys the Modularize pass sets on the nested GraphModules.
"""

from __future__ import annotations

import dataclasses
from typing import Any

# On every module call node (and on function bodies' nodes after inlining).
META_PATH = "onnx_modular.module_path"
META_TYPE = "onnx_modular.module_type"
META_CALL = "onnx_modular.call_id"
META_FX_OUTPUTS = "onnx_modular.fx_outputs"  # JSON: the FX node of each call output
META_SCOPE = "onnx_modular.scope"  # JSON: [[module path, class], ...] from the root to the call
# On a function: "relative" when every label inside names paths relative to the module.
LABELS = "onnx_modular.labels"
# On an extra function of a class: why it is not the class's first function.
DIFFERS_FROM = "onnx_modular.differs_from"
# torch.onnx's, on every node it translates.
FX_NODE = "pkg.torch.onnx.fx_node"
NAME_SCOPES = "pkg.torch.onnx.name_scopes"
CLASS_HIERARCHY = "pkg.torch.onnx.class_hierarchy"
STACK_TRACE = "pkg.torch.onnx.stack_trace"
NAMESPACE = "namespace"
# On every part model of a parts directory (and its manifest): which save it belongs to.
PARTS_SET_ID = "onnx_modular.parts_set_id"
# On a region's call node in a single-file split model.
REGION_KIND = "onnx_modular.region_kind"

# torch.export's stand-in ``nn_module_stack`` key for nodes its passes add: not a module.
NO_MODULE = "_empty_nn_module_stack_from_metadata_hook"

# FX ``node.meta`` of the modularized GraphModules.
FX_CALL = "om_call"  # on a call_module node: the CallInfo of the module call
FX_NAME = "om_fx_name"  # on every copied node: its name in the input program
# FX ``GraphModule.meta`` of a flat module a planner ran on (and of the module cut from it).
FX_SPLIT_PLAN = "om_split_plan"  # the SplitPlan (regions or stages) CutRegions cuts along


@dataclasses.dataclass(frozen=True)
class CallInfo:
    """One module call: ``call_id`` is unique per call; ``module_path`` is the FQN."""

    call_id: str
    module_path: str
    module_type: str


def fx_name(node: Any) -> str | None:
    """The FX node an ONNX node was translated from: ``%name : ...`` -> ``name``."""
    text = node.metadata_props.get(FX_NODE)
    if not text or not text.startswith("%"):
        return None
    return text[1:].split(" ", 1)[0]
