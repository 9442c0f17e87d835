"""The torch check at import: an older torch gets one line naming what is needed."""

import re
from importlib import metadata

import pytest

from onnx_modular.leaves import _version


@pytest.mark.parametrize("found", ["2.11.0+cu130", "2.12.1", "1.13.0"])
def test_an_older_torch_is_refused_in_one_line(monkeypatch, found: str) -> None:
    monkeypatch.setattr(_version.metadata, "version", lambda name: found)
    expected = rf"needs torch >= 2\.13 \(this environment has torch {re.escape(found)}\)"
    with pytest.raises(ImportError, match=expected):
        _version.check_torch()


@pytest.mark.parametrize("found", ["2.13.0", "2.15.0+cpu", "2.16.0.dev20261101", "3.0"])
def test_the_tested_range_and_newer_pass(monkeypatch, found: str) -> None:
    monkeypatch.setattr(_version.metadata, "version", lambda name: found)
    _version.check_torch()


def test_no_metadata_leaves_it_to_the_import(monkeypatch) -> None:
    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)
    monkeypatch.setattr(_version.metadata, "version", missing)
    _version.check_torch()


def test_this_environment_passes() -> None:
    _version.check_torch()
