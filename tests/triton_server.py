"""A real Triton Inference Server on 127.0.0.1 for tests and the serving benchmark.

The server is the ``tritonserver`` binary of the ``nvidia-pytriton`` wheel (installed with
``--no-deps``); its onnxruntime backend is the CPU build in ``../shared/triton`` beside the
repository root (see its README). :func:`missing` says why a server cannot start here.
"""

from __future__ import annotations

import contextlib
import importlib.util
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHARED_TRITON = ROOT.parent / "shared" / "triton"


def server_binary() -> Path | None:
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    binary = Path(next(iter(spec.submodule_search_locations))) / "tritonserver" / "bin" / \
        "tritonserver"
    return binary if binary.is_file() else None


def missing() -> str | None:
    """Why no server can run here (None: it can)."""
    if server_binary() is None:
        return "no tritonserver: pip install --no-deps nvidia-pytriton==0.7.0"
    if not (SHARED_TRITON / "make_backend_dir.sh").is_file():
        return f"no onnxruntime backend for Triton: {SHARED_TRITON} is missing"
    if importlib.util.find_spec("geventhttpclient") is None:
        return "no Triton HTTP client: pip install 'tritonclient[http]'"
    return None


def backend_dir(out: Path) -> Path:
    """A backend directory with the onnxruntime backend linked to this Python's ORT."""
    subprocess.run(["bash", str(SHARED_TRITON / "make_backend_dir.sh"), str(out),
                    sys.executable], check=True, capture_output=True)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A running ``tritonserver``: ``url`` (HTTP, host:port), ``log``."""

    def __init__(self, process: subprocess.Popen[bytes], url: str, log: Path) -> None:
        self.process, self.url, self.log = process, url, log

    def client(self) -> Any:  # tritonclient.http.InferenceServerClient
        import tritonclient.http as http

        return http.InferenceServerClient(self.url, network_timeout=120.0)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@contextlib.contextmanager
def running(repository: Path, backends: Path, log: Path, *, models: Sequence[str] = (),
            explicit: bool = True, timeout: float = 120.0) -> Iterator[Server]:
    """Start a server on 127.0.0.1 (a free HTTP port, no gRPC, no metrics), wait until it is
    ready (``timeout`` seconds at most), and stop it on the way out, whatever happened.
    ``explicit``: only ``models`` are loaded at start, the rest with ``load_model``."""
    binary = server_binary()
    assert binary is not None, missing()
    port = free_port()
    command = [str(binary), "--model-repository", str(repository),
               "--backend-directory", str(backends), "--http-address", "127.0.0.1",
               "--http-port", str(port), "--allow-grpc", "false", "--allow-metrics", "false",
               "--exit-timeout-secs", "5"]
    if explicit:
        command += ["--model-control-mode", "explicit"]
        command += [f"--load-model={m}" for m in models]
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    server = Server(process, f"127.0.0.1:{port}", log)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"tritonserver exited ({process.returncode}):\n"
                                   f"{server.log_tail()}")
            with contextlib.suppress(OSError):
                ready = f"http://{server.url}/v2/health/ready"
                with urllib.request.urlopen(ready, timeout=2) as response:
                    if response.status == 200:
                        break
            if time.monotonic() > deadline:
                raise RuntimeError(f"tritonserver not ready after {timeout} s:\n"
                                   f"{server.log_tail()}")
            time.sleep(0.2)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)
