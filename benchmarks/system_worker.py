"""A system's worker process for `benchmarks/grpo_vs_trl.py`: its packages first on its path,
its system built and stepped on the parent's commands over a pipe (`worker`), and the
parent's side (`Worker`): its answers awaited (with ``--step-timeout``, for so long), its
failures read (`WorkerFailed`, out of memory told apart), and the process ended with every
process it started."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any

from benchmarks.ours_system import Ours, memory_phases
from benchmarks.peak_memory import PeakMemory
from benchmarks.trl_system import run_trl
from benchmarks.workload import Spec, StepTime, package_versions, prompts_of


@dataclass(frozen=True)
class SystemPath:
    """Where a system's worker imports from: `first` (its ``--SYSTEM-path``) before the
    parent's own path, less `hidden` (every other system's ``--SYSTEM-path``), so that no
    package of another system's target reaches it. One that did broke verl's vLLM: SGLang's
    FlashInfer kernel wheel, on the parent's ``PYTHONPATH`` for ours, beside vLLM's own older
    FlashInfer ("flashinfer-jit-cache version ... does not match flashinfer version")."""

    first: list[str] = field(default_factory=list)
    hidden: list[str] = field(default_factory=list)

    def without_hidden(self, entries: list[str]) -> list[str]:
        gone = {os.path.realpath(folder) for folder in self.hidden}
        return [e for e in entries if not e or os.path.realpath(e) not in gone]

    def search(self) -> list[str]:
        """The `sys.path` the worker will have (this process's, as the worker inherits it)."""
        return self.first + self.without_hidden(sys.path)

    def use(self) -> None:
        """Make it this process's `sys.path` and, for the processes it starts (SGLang's
        scheduler, verl's Ray actors and vLLM server), its ``PYTHONPATH``."""
        sys.path[:] = self.search()
        rest = [e for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if e]
        entries = self.first + self.without_hidden(rest)
        if entries:
            os.environ["PYTHONPATH"] = os.pathsep.join(entries)
        else:
            os.environ.pop("PYTHONPATH", None)


def worker(kind: str, spec: Spec, steps: int, baseline: int, path: SystemPath, conn: Any) -> None:
    path.use()  # before the systems' packages: this module's top imports none of them
    from trainer.arguments import UsageError

    try:
        import torch

        memory = PeakMemory(spec.device, baseline)
        allocated = reserved = None
        if kind in ("trl", "trl-vllm", "unsloth"):
            run_trl(spec, kind, steps, conn, memory)
        elif kind == "verl":
            from benchmarks import verl_system

            versions = package_versions()
            allocated, reserved = verl_system.run(
                spec, steps, conn, memory, versions, prompts_of(spec)
            )
        else:
            system = Ours(spec, steps, memory_phases(memory))
            try:
                conn.send(("ready", package_versions()))
                for _ in range(steps):
                    command = conn.recv()
                    if command == "reset":
                        memory.reset()
                        if spec.device.startswith("cuda"):
                            torch.cuda.reset_peak_memory_stats()
                        command = conn.recv()
                    memory.watch()
                    step = system.step()
                    memory.pause()
                    memory.idle()
                    conn.send(asdict(step))
            finally:  # SGLang's engine processes end with it, on a failure too
                system.close()
        if kind != "verl":  # verl's actor is in Ray's processes: verl says its peaks
            cuda = spec.device.startswith("cuda")
            allocated = torch.cuda.max_memory_allocated() if cuda else 0
            reserved = torch.cuda.max_memory_reserved() if cuda else None
        conn.send(
            (
                "memory",
                {
                    "peak": memory.stop(),
                    "peak_own": memory.peak_own,
                    "peak_by_phase": memory.peak_by_phase,
                    "allocated": allocated,
                    "reserved": reserved,
                    "per_process": memory.per_process,
                },
            )
        )
    except UsageError as err:  # ours' argv, e.g. a bad --ours-flags: one line
        conn.send(("usage", f"train.py flags: {err}"))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        raise


class WorkerFailed(Exception):
    """A system's worker raised (its traceback) or died without a result."""

    def __init__(self, kind: str, details: str) -> None:
        super().__init__(f"the {kind} worker failed:\n{details.rstrip()}")
        self.kind = kind
        self.details = details.rstrip()

    @property
    def reason(self) -> str:
        """The traceback's last line: the exception (e.g. CUDA's out of memory)."""
        return self.details.splitlines()[-1] if self.details else "no details"


# how the systems say that the GPU is too small: torch's allocator, and vLLM's start-up when its
# share leaves no room for the KV cache
OUT_OF_MEMORY = ("out of memory", "OutOfMemoryError", "No available memory for the cache blocks")


def out_of_memory(details: str) -> bool:
    """Whether a worker's traceback says the system did not fit the device."""
    return any(sign in details for sign in OUT_OF_MEMORY)


class Worker:
    """A system's worker process; `timeout` (``--step-timeout``): the longest wait for any
    one answer (its start, a step, its memory), None for no limit."""

    def __init__(
        self,
        kind: str,
        spec: Spec,
        steps: int,
        baseline: int,
        path: SystemPath,
        timeout: float | None = None,
    ) -> None:
        context = multiprocessing.get_context("spawn")
        self.kind = kind
        self.timeout = timeout
        self.conn, child = context.Pipe()
        self.process = context.Process(
            target=worker, args=(kind, spec, steps, baseline, path, child)
        )
        self.process.start()
        child.close()  # so that a worker that dies reads as EOF here, not as a wait forever
        try:
            _, self.versions = self.expect("ready")
        except WorkerFailed:
            self.stop()  # not yet in the caller's hands: nobody else would end it
            raise

    def receive(self) -> Any:
        if self.timeout is not None and not self.conn.poll(self.timeout):
            raise WorkerFailed(self.kind, f"no answer within {self.timeout:g} s (--step-timeout)")
        try:
            message = self.conn.recv()
        except EOFError:
            self.process.join(timeout=30)
            raise WorkerFailed(
                self.kind, f"exited (code {self.process.exitcode}) without a result"
            ) from None
        if isinstance(message, tuple) and message[0] == "usage":
            self.process.join(timeout=30)
            sys.exit(f"grpo_vs_trl: {message[1]}")
        if isinstance(message, tuple) and message[0] == "error":
            self.process.join(timeout=30)
            raise WorkerFailed(self.kind, message[1])
        return message

    def expect(self, tag: str) -> tuple[Any, ...]:
        message = self.receive()
        if not (isinstance(message, tuple) and message[0] == tag):
            sys.exit(f"grpo_vs_trl: the {self.kind} worker sent {message!r}, expected {tag}")
        return message

    def step(self, reset: bool = False) -> StepTime:
        if reset:
            self.conn.send("reset")
        self.conn.send("step")
        return StepTime(**self.receive())  # plain dicts cross the pipe, not __mp_main__ classes

    def finish(self) -> dict[str, Any]:
        """The worker's memory: NVML's (or the RSS) peak, its own share, its peak by phase,
        torch's allocated and reserved peaks, whether NVML counted per process."""
        _, memory = self.expect("memory")
        self.process.join(timeout=120)
        return memory

    def stop(self) -> None:
        """End the worker process if it still runs (a failure elsewhere left it waiting, or it
        hung), and every process it started: an engine's, or the Ray cluster verl starts, would
        otherwise keep their GPU memory from the next system."""
        if self.process.is_alive():
            started = descendants(self.process.pid)
            self.process.terminate()
            self.process.join(timeout=30)
            end(started)
        self.process.join(timeout=60)


def descendants(pid: int) -> list[Any]:
    """The processes `pid` started, and theirs (psutil's), or none where psutil is missing
    here (then only the worker is ended)."""
    try:
        import psutil
    except ImportError:
        return []
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def end(processes: list[Any]) -> None:
    """Kill `processes` (psutil's) that still run, and wait for them."""
    if not processes:
        return
    import psutil

    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(processes, timeout=30)
