"""The shared report base: Markdown tables, number formatters, rendering and saving."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from onnx_modular.check.report import Report, fmt_err, fmt_tol, md_table
from onnx_modular.diagnostics import OnnxModularError


def test_md_table_has_a_head_a_rule_and_escapes_pipes() -> None:
    lines = md_table(["a", "b"], [["1", "x|y"], ["", "z"]])
    assert lines == ["| a | b |", "|---|---|", "| 1 | x\\|y |", "|  | z |"]


def test_md_table_without_rows_is_just_the_head() -> None:
    assert md_table(["only"], []) == ["| only |", "|---|"]


@pytest.mark.parametrize("x, text", [
    (0.0, "0"), (1.0, "1"), (0.000123456, "0.000123"), (123456.0, "1.23e+05"),
    (1e-12, "1e-12"), (math.nan, "nan"), (math.inf, "inf"), (-math.inf, "-inf"),
])
def test_fmt_err_keeps_three_significant_digits(x: float, text: str) -> None:
    assert fmt_err(x) == text


@pytest.mark.parametrize("x, text", [
    (0.0, "0"), (1e-4, "1e-4"), (1e-5, "1e-5"), (2.5e-3, "2.5e-3"), (1.0, "1e+00"),
    (1e-10, "1e-10"), (math.inf, "inf"), (math.nan, "nan"),
])
def test_fmt_tol_reads_as_powers_of_ten(x: float, text: str) -> None:
    assert fmt_tol(x) == text


class _Tiny(Report):
    def __rich__(self) -> Any:
        from rich.text import Text

        return Text("[bold]not markup[/bold] rendered")

    def to_dict(self) -> dict[str, Any]:
        return {"ok": True, "n": 1}

    def to_markdown(self) -> str:
        return "# tiny\n"


def test_str_is_the_plain_text_rendering() -> None:
    assert str(_Tiny()).strip() == "[bold]not markup[/bold] rendered"


def test_render_prints_on_the_given_console() -> None:
    from rich.console import Console

    console = Console(record=True, width=80, file=open("/dev/null", "w"))  # noqa: SIM115
    _Tiny().render(console)
    assert "rendered" in console.export_text()


@pytest.mark.parametrize("suffix", [".json", ".JSON", ".md", ".markdown", ".html", ".htm"])
def test_save_writes_the_format_its_suffix_names(tmp_path, suffix: str) -> None:
    path = tmp_path / f"r{suffix}"
    _Tiny().save(path)
    text = path.read_text()
    if suffix.lower() == ".json":
        assert json.loads(text) == {"ok": True, "n": 1}
    elif suffix in (".md", ".markdown"):
        assert text == "# tiny\n"
    else:
        assert text.lstrip().lower().startswith("<!doctype html") and "rendered" in text


def test_save_refuses_an_unknown_suffix_in_one_line(tmp_path) -> None:
    with pytest.raises(OnnxModularError) as info:
        _Tiny().save(tmp_path / "r.txt")
    message = str(info.value)
    assert "\n" not in message and "OM0501" in message and ".json, .md or .html" in message
    assert not (tmp_path / "r.txt").exists()


def test_save_into_a_missing_folder_or_onto_a_directory_is_one_line(tmp_path) -> None:
    (tmp_path / "d.json").mkdir()
    for path in (tmp_path / "missing" / "r.json", tmp_path / "d.json"):
        with pytest.raises(OnnxModularError, match="cannot write") as info:
            _Tiny().save(path)
        assert "\n" not in str(info.value)


def test_the_base_asks_subclasses_for_their_renderings() -> None:
    for method in (Report().to_dict, Report().to_markdown, Report().__rich__):
        with pytest.raises(NotImplementedError):
            method()
