"""Chain the stages of one model served by several Triton servers (when one machine is not
enough): the client calls each part model on the server that holds it, in order, and passes
the border tensors on, as :class:`SplitRunner` does with ONNX Runtime sessions.

Each server loads some of the part models of a repository :func:`save_triton` wrote
(``tritonserver --model-control-mode explicit --load-model <name>_stage_0 ...``). The wiring
comes from the repository's ensemble config (or a parts directory's ``manifest.json``); a
server holding a model of another save is refused (its config's set id differs).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from onnx_modular.leaves import runtime
from onnx_modular.leaves.errors import fail, rules
from onnx_modular.parts.manifest import MANIFEST, load_manifest
from onnx_modular.parts.triton import (
    SET_ID_KEY,
    config_parameter,
    load_repository,
    part_model_name,
)


class TritonRunner:
    """Runs the part models of ``repo_or_manifest`` on Triton servers, chained.

    ``endpoints``: ``"host:port"`` for every model, or model or part name (``"stage_0"``)
    -> ``"host:port"`` (``"*"``: every model not named). ``protocol``: ``"http"`` or
    ``"grpc"`` (tritonclient's clients; gRPC needs ``tritonclient[grpc]``). ``name``: the
    ensemble to run where the repository holds several (with a parts directory: the
    ``name`` it was saved to Triton with, default ``model``).
    """

    def __init__(self, repo_or_manifest: str | os.PathLike[str],
                 endpoints: str | Mapping[str, str], *, name: str | None = None,
                 protocol: str = "http", timeout: float = 60.0) -> None:
        if protocol not in ("http", "grpc"):
            raise fail(f"protocol={protocol!r}: expected 'http' or 'grpc'")
        self.protocol = protocol
        self.timeout = timeout
        path = Path(repo_or_manifest)
        #: (model name, part name, input names, output names), in execution order
        self.steps: list[tuple[str, str, list[str], list[str]]] = []
        if (path / MANIFEST).is_file():
            self._from_manifest(path, name or "model")
        else:
            self._from_repository(path, name)
        self.endpoints = {model: _endpoint(endpoints, model, part)
                          for model, part, _, _ in self.steps}
        self._clients: dict[str, Any] = {}
        self._checked: set[str] = set()
        self._lock = threading.Lock()

    def _from_manifest(self, path: Path, name: str) -> None:
        manifest = load_manifest(path)
        self.set_id: str | None = None
        self.version = ""
        self.inputs = [e["name"] for e in manifest["inputs"]]
        self.outputs = [e["name"] for e in manifest["outputs"]]
        for part in manifest["regions"]:
            if part.get("outputs"):
                self.steps.append((part_model_name(name, part["name"]), part["name"],
                                   [e["name"] for e in part.get("inputs", [])],
                                   [e["name"] for e in part["outputs"]]))

    def _from_repository(self, path: Path, name: str | None) -> None:
        repo = load_repository(path, name)
        self.set_id = repo.set_id
        self.version = str(repo.version)
        configs = repo.configs()
        ensemble = configs[repo.ensemble]
        self.inputs = [e.name for e in ensemble.input]
        self.outputs = [e.name for e in ensemble.output]
        prefix = f"{repo.ensemble}_"
        for model in repo.models:
            config = configs[model]
            self.steps.append((model, model.removeprefix(prefix),
                               [e.name for e in config.input], [e.name for e in config.output]))

    def client(self, model: str) -> Any:
        """tritonclient's client for the server of ``model`` (one per endpoint)."""
        url = self.endpoints[model]
        with self._lock:
            if url not in self._clients:
                module = _client_module(self.protocol)
                try:
                    if self.protocol == "http":
                        self._clients[url] = module.InferenceServerClient(
                            url, connection_timeout=self.timeout,
                            network_timeout=self.timeout)
                    else:
                        self._clients[url] = module.InferenceServerClient(url)
                except Exception as e:
                    raise fail(f"cannot connect to {url} (the endpoint of '{model}'): "
                               f"{runtime.first_line(e)}", rules.VALIDATION) from e
            return self._clients[url]

    def _check(self, model: str) -> None:
        """The server serves this save's model (same set id), checked once per model."""
        if self.set_id is None or model in self._checked:
            return
        url = self.endpoints[model]
        try:
            config = self.client(model).get_model_config(model)
        except OSError as e:
            raise fail(f"no Triton server answers at {url} (the endpoint of '{model}'): "
                       f"{runtime.first_line(e)}", rules.VALIDATION) from e
        except Exception as e:
            raise fail(f"model '{model}' is not served at {url}: {runtime.first_line(e)} (load it "
                       f"there: tritonserver ... --load-model {model})", rules.VALIDATION) from e
        found = _set_id_of(config)
        if found != self.set_id:
            raise fail(f"{url} serves model '{model}' of another save (set id {found}, the "
                       f"repository's is {self.set_id}); load the same repository on every "
                       "server", rules.VALIDATION)
        self._checked.add(model)

    def run(self, *inputs: Any) -> Any:
        """The model's outputs for ``inputs`` (arrays in the model's input order): a single
        output or a tuple, as torch tensors where the inputs were."""
        if len(inputs) != len(self.inputs):
            raise fail(f"the model takes {len(self.inputs)} input(s) "
                       f"({', '.join(self.inputs)}), got {len(inputs)}")
        as_torch = any(type(x).__module__.startswith("torch") for x in inputs)
        env = {n: _numpy(x) for n, x in zip(self.inputs, inputs)}
        module = _client_module(self.protocol)
        for model, _, names, outputs in self.steps:
            self._check(model)
            missing = next((n for n in names if n not in env), None)
            if missing is not None:
                raise fail(f"model '{model}' reads '{missing}', which no earlier part produces",
                           rules.VALIDATION)
            request = request_inputs({n: env[n] for n in names}, self.protocol)
            wanted = [module.InferRequestedOutput(n) for n in outputs]
            try:
                result = self.client(model).infer(model, request, model_version=self.version,
                                                  outputs=wanted)
            except Exception as e:
                raise fail(f"model '{model}' at {self.endpoints[model]} failed: "
                           f"{runtime.first_line(e)}", rules.VALIDATION) from e
            for n in outputs:
                env[n] = result.as_numpy(n)
        flat = [env[n] for n in self.outputs]
        if as_torch:
            import torch

            flat = [torch.from_numpy(np.require(x, requirements=["C", "W"])) for x in flat]
        return flat[0] if len(flat) == 1 else tuple(flat)

    __call__ = run

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()


def request_inputs(arrays: Mapping[str, np.ndarray], protocol: str = "http") -> list[Any]:
    """tritonclient's ``InferInput`` list for ``{name: array}``, in order."""
    from tritonclient.utils import np_to_triton_dtype

    module = _client_module(protocol)
    entries = []
    for name, value in arrays.items():
        entry = module.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
        entry.set_data_from_numpy(value)
        entries.append(entry)
    return entries


def _endpoint(endpoints: str | Mapping[str, str], model: str, part: str) -> str:
    if isinstance(endpoints, str):
        url = endpoints
    elif model in endpoints or part in endpoints or "*" in endpoints:
        url = endpoints.get(model) or endpoints.get(part) or endpoints["*"]
    else:
        raise fail(f"no endpoint for model '{model}' (give endpoints={{'{part}': "
                   "'host:port', ...} or '*' for the rest)")
    if not isinstance(url, str) or not url:
        raise fail(f"endpoint of '{model}' must be 'host:port', got {url!r}")
    url = url.split("://", 1)[-1]
    check_endpoint(url, model)
    return url


def check_endpoint(url: str, model: str) -> None:
    """``host:port`` with a port from 1 to 65535, or one line saying what is wrong (before
    tritonclient sees it: its client half-built on a bad port fails again as it is
    collected, with a traceback)."""
    host, sep, port = url.rstrip("/").rpartition(":")
    host = host.strip("[]")  # [::1]:8000
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise fail(f"endpoint '{url}' of '{model}' is not HOST:PORT with a port from 1 to "
                   "65535", rules.BAD_INPUT)


def _client_module(protocol: str) -> Any:
    try:
        if protocol == "http":
            import tritonclient.http as module
        else:
            import tritonclient.grpc as module
    except (ImportError, RuntimeError) as e:
        raise fail(f"the Triton {protocol} client is not installed: pip install "
                   f"'tritonclient[{protocol}]'") from e
    return module


def _set_id_of(config: Any) -> str | None:
    """The set id in a model config as either client returns it (a dict over HTTP, a
    protobuf message over gRPC)."""
    if isinstance(config, dict):
        return ((config.get("parameters") or {}).get(SET_ID_KEY) or {}).get("string_value")
    return config_parameter(getattr(config, "config", config), SET_ID_KEY)


def _numpy(value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    if type(value).__module__.startswith("torch"):
        return value.detach().cpu().numpy()
    raise fail(f"inputs must be numpy arrays or torch tensors, got {type(value).__name__}")
