"""A pytest run inside the suite starts clean of the running test's pytest variables."""

from __future__ import annotations

from tests.support.nested_pytest import run_pytest

PROBE = """
import os

def test_the_outer_runs_variables_are_gone():
    assert os.environ.get("PYTEST_XDIST_WORKER") is None
    assert os.environ.get("PYTEST_XDIST_WORKER_COUNT") is None
    assert os.environ["KEPT"] == "yes"
"""


def test_an_inner_run_is_no_xdist_worker_of_the_outer_one(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    monkeypatch.setenv("KEPT", "no")
    (tmp_path / "test_probe.py").write_text(PROBE)
    done = run_pytest("test_probe.py", cwd=tmp_path, env={"KEPT": "yes"}, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
