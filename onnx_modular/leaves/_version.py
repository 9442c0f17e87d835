"""The package version, and the oldest torch it runs on, in a leaf every module may read."""

from importlib import metadata

__version__ = "0.1.0"

#: The oldest torch the package imports on (pyproject's range; CI tests 2.13 to 2.15).
OLDEST_TORCH = (2, 13)


def check_torch() -> None:
    """An older torch (a venv made with ``--no-deps``, a PYTHONPATH over an image's torch)
    fails deep inside an import; say what is needed instead, before torch is imported."""
    try:
        found = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return  # a source build without metadata: let the import say what is missing
    parts = found.split("+")[0].split(".")
    try:
        major_minor = (int(parts[0]), int(parts[1]))
    except (IndexError, ValueError):
        return
    if major_minor < OLDEST_TORCH:
        raise ImportError(f"onnx_modular needs torch >= {OLDEST_TORCH[0]}.{OLDEST_TORCH[1]} "
                          f"(this environment has torch {found}); install a newer torch, "
                          f"e.g. pip install 'torch>=2.13,<2.16'")
