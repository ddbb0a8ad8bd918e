"""The manual GPU tests' runner (`tests/manual/live_run.py`): its interrupt reaches the run."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from tests.manual import live_run

CHILD = """
import pathlib, sys, time
try:
    pathlib.Path(sys.argv[1]).touch()
    time.sleep(60)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(130)
"""


def test_the_interrupt_reaches_a_run_started_where_sigint_is_ignored(tmp_path, monkeypatch):
    """Under `nohup ... &` the test process inherits SIGINT ignored; the run it starts must
    still take the interrupt as Ctrl-C (exit 130), not run on until it is killed."""
    monkeypatch.setattr(live_run, "GRACE_S", 10)
    ready = tmp_path / "ready"
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        finished = live_run.run_streaming(
            [sys.executable, "-c", CHILD, str(ready)],
            label="child", budget_s=60, cwd=tmp_path, env={}, log=tmp_path / "log",
            interrupt_when=ready.exists,
        )  # fmt: skip
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # the test process's own
    finally:
        signal.signal(signal.SIGINT, previous)
    assert finished.interrupted
    assert (finished.returncode, finished.output) == (130, "interrupted\n")
    assert Path(tmp_path / "log").read_text() == "interrupted\n"


QUIET_CHILD = """
import time

def waiting_on_purpose():
    time.sleep(60)

print("about to wait", flush=True)
waiting_on_purpose()
"""


def test_a_silent_run_shows_where_its_processes_wait(tmp_path):
    """A run that prints nothing for `quiet_s` gets the stacks of the Python processes it
    started in its log (once per silence), which name the function it waits in."""
    log = tmp_path / "log"
    finished = live_run.run_streaming(
        [sys.executable, "-c", QUIET_CHILD], label="child", budget_s=60, cwd=tmp_path, env={},
        log=log, quiet_s=1, interrupt_when=lambda: "end of the stacks" in log.read_text(),
    )  # fmt: skip
    assert finished.interrupted
    assert finished.output.startswith("about to wait\n")  # the run's own lines only
    shown = log.read_text()
    assert shown.count("no output for 1 s") == 1
    assert "waiting_on_purpose (<string>:" in shown
