"""docs/lora.md's support matrix is what the launchers declare, and the check catches drift."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from harness import discovery
from harness.discovery import discover_launchers
from harness.support_matrix import BEGIN, DOC, END, MatrixError, build_table, current_table, main


@pytest.fixture(scope="module")
def table() -> str:
    return build_table()


def test_doc_holds_the_generated_table(table: str) -> None:
    assert current_table(DOC.read_text(encoding="utf-8")) == table, (
        "docs/lora.md disagrees with the launchers: run python -m harness.support_matrix --write"
    )


def test_every_launcher_has_a_row_with_the_evidence_it_declares(table: str) -> None:
    for launcher in discover_launchers():
        (line,) = [line for line in table.splitlines() if f"[`{launcher.path}.py`]" in line]
        assert launcher.evidence and f"| {launcher.evidence} |" in line


def test_a_launcher_without_evidence_has_no_row() -> None:
    (launcher, *_) = discover_launchers()
    with pytest.raises(MatrixError, match=f"{launcher.module} declares no evidence"):
        build_table([dataclasses.replace(launcher, evidence="")])


def test_amd_row_names_the_triton_backends(table: str) -> None:
    (amd,) = [line for line in table.splitlines() if "launchers/amd/run_qwen3_4b_lora.py" in line]
    assert "ROCm (MI350X, MI355X)" in amd
    assert "SGLang (attention `triton`, LoRA `triton`)" in amd
    assert "Megatron-Bridge" in amd


def test_check_fails_when_a_declaration_and_the_doc_disagree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = tmp_path / "lora.md"
    doc.write_text(f"# LoRA\n\n{BEGIN}\nold table\n{END}\n\nafter\n", encoding="utf-8")
    assert main(["--check", "--doc", str(doc)]) == 1
    assert main(["--write", "--doc", str(doc)]) == 0
    assert main(["--check", "--doc", str(doc)]) == 0
    assert doc.read_text(encoding="utf-8").endswith(f"{END}\n\nafter\n")

    module = "launchers.amd.run_qwen3_4b_lora"
    changed = [
        dataclasses.replace(launcher, evidence="no evidence at all")
        if launcher.module == module
        else launcher
        for launcher in discover_launchers()
    ]
    monkeypatch.setattr(discovery, "discover_launchers", lambda: changed)
    capsys.readouterr()
    assert main(["--check", "--doc", str(doc)]) == 1
    assert "is stale: run python -m harness.support_matrix --write" in capsys.readouterr().err


def test_a_doc_without_markers_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = tmp_path / "lora.md"
    doc.write_text("# LoRA\n", encoding="utf-8")
    with pytest.raises(SystemExit) as exit_info:
        main(["--check", "--doc", str(doc)])
    assert exit_info.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
