"""Per-step metrics: a console line, ``<output-dir>/metrics.jsonl``, and wandb when asked.

A resumed run first drops the JSONL records of steps at or after the one it resumes from (a
killed run may have logged steps its last checkpoint does not hold), so every step appears
exactly once. A last line that is not a whole record is what a kill in the middle of a write
leaves: readers drop it (`torn_tail` names it, for a note); damage anywhere else is a
`MetricsError`. wandb is imported only with ``--use-wandb``; its mode is ``--wandb-mode``
(offline unless ``WANDB_API_KEY`` is set), and a resumed run continues the same wandb run.
"""

from __future__ import annotations

import json
import math
import os
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common import owned_files
from trainer.errors import UsageError

if TYPE_CHECKING:
    from trainer.config import TrainConfig

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
WANDB_ID_FILE = "wandb_run_id"
REWARD = "rollout/reward_mean"

# (metric key, console label, format) of the one-line console report, in order.
_CONSOLE = (
    (REWARD, "reward", "{:.3f}"),
    ("rollout/reward_std", "±", "{:.2f}"),
    ("rollout/response_len_mean", "len", "{:.1f}"),
    ("rollout/truncated_ratio", "trunc", "{:.2f}"),
    ("train/kl", "kl", "{:.2e}"),
    ("train/pg_clipfrac", "clip", "{:.3f}"),
    ("train/entropy", "ent", "{:.2f}"),
    ("train/train_rollout_logprob_abs_diff", "lp_diff", "{:.1e}"),
    ("train/grad_norm", "gnorm", "{:.3f}"),
    ("train/lr", "lr", "{:.1e}"),
    ("time/step", "time", "{:.2f}s"),
)


class MetricsError(UsageError):
    """A metrics file that cannot be read, or damaged before its last line (one line)."""


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics file (none when it does not exist), without a torn last line."""
    return parse_metrics(path)[0]


def torn_tail(path: Path) -> str | None:
    """A note naming the torn last line of `path` that readers drop; None when it is whole."""
    torn = parse_metrics(path)[1]
    if torn is None:
        return None
    shown = torn if len(torn) <= 60 else torn[:57] + "..."
    return f"{path}: dropping its torn last line {shown!r} (a run killed while writing it)"


def parse_metrics(path: Path) -> tuple[list[dict[str, Any]], str | None]:
    """(records, the torn last line or None); `MetricsError` for any other bad line.

    Torn is a last line without its newline that is not JSON: a record is written with its
    newline in one go, so only a write cut short leaves that.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return [], None
    except OSError as err:
        raise MetricsError(f"{path}: cannot read it ({err.strerror or err})") from None
    *whole, tail = data.split(b"\n")
    records = []
    for number, line in enumerate([*whole, tail], start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            if number > len(whole):
                return records, line.decode("utf-8", errors="backslashreplace")
            reason = err.msg if isinstance(err, json.JSONDecodeError) else "not UTF-8"
            raise MetricsError(f"{path}:{number}: invalid JSON ({reason})") from None
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            raise MetricsError(f"{path}:{number}: not a metrics record (no 'step')")
        records.append(record)
    return records, None


def console_line(step: int, total: int, metrics: Mapping[str, float]) -> str:
    parts = [f"step {step + 1}/{total}"]
    for key, label, fmt in _CONSOLE:
        if key in metrics:
            parts.append(f"{label} {fmt.format(metrics[key])}")
    parts += [
        f"{key} {value:.3f}" for key, value in sorted(metrics.items()) if key.startswith("eval/")
    ]
    return " | ".join(parts)


class MetricsLogger:
    def __init__(
        self,
        output_dir: Path,
        *,
        total_steps: int,
        start_step: int = 0,
        config: TrainConfig | None = None,
    ) -> None:
        """`config`: the run's, for wandb (``--use-wandb``), which records it. Makes
        `output_dir` (a private one: `owned_files.owned_dir`)."""
        self.path = output_dir / METRICS_FILE
        self.total_steps = total_steps
        with _one_line(self.path):
            owned_files.owned_dir(output_dir)
            kept = read_metrics(self.path) if start_step else []
            kept = [r for r in kept if r["step"] < start_step]
            owned_files.write_atomic(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        wanted = config is not None and config.wandb.use_wandb
        wanted = wanted and config.wandb.wandb_mode != "disabled"
        self._wandb = _init_wandb(output_dir, config) if wanted else None

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        record = {"step": step, **{k: _finite(v) for k, v in metrics.items()}}
        with _one_line(self.path):
            owned_files.append_line(self.path, json.dumps(record) + "\n")
        print(console_line(step, self.total_steps, metrics), flush=True)
        if self._wandb is not None:
            self._wandb.log(dict(metrics), step=step)

    def close(self) -> None:
        if self._wandb is not None:
            self._wandb.finish()


@contextmanager
def _one_line(path: Path) -> Iterator[None]:
    """A file of the run's output that cannot be written (a symlink planted at its path, a full
    disk, an output directory others may change) as one `MetricsError` line."""
    try:
        yield
    except owned_files.NotPrivate as err:
        raise MetricsError(str(err)) from None
    except OSError as err:
        raise MetricsError(f"{path}: cannot write it ({err.strerror or err})") from None


def _finite(value: float) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


def _init_wandb(output_dir: Path, config: TrainConfig) -> Any:
    import wandb

    id_file = output_dir / WANDB_ID_FILE
    with _one_line(id_file):
        exists = os.path.lexists(id_file)
        run_id = owned_files.read_text(id_file).strip() if exists else uuid.uuid4().hex[:8]
        owned_files.write_atomic(id_file, run_id)
    return wandb.init(
        project=config.wandb.wandb_project,
        group=config.wandb.wandb_group,
        name=config.wandb.wandb_run_name,
        mode=config.wandb.wandb_mode,
        dir=str(output_dir),
        id=run_id,
        resume="allow",
        config=config.as_dict(),
    )


def summarize(
    records: Sequence[Mapping[str, Any]],
    *,
    elapsed_s: float,
    adapter: Path | None,
    merged_in: str | None = None,
) -> dict[str, Any]:
    """First/last-5 reward means and the rest of the end-of-run summary; `merged_in`: the
    dtype of the merged weights the run trained and served (``--lora-serving merged``), the
    only form in which the saved adapter is exactly the trained policy."""
    rewards = [r[REWARD] for r in records if _number(r.get(REWARD))]
    evals = {
        k: v if _number(v) else None for r in records for k, v in r.items() if k.startswith("eval/")
    }
    step_times = [r["time/step"] for r in records if _number(r.get("time/step"))]
    return {
        "steps": len(records),
        "reward_first5": sum(rewards[:5]) / len(rewards[:5]) if rewards else None,
        "reward_last5": sum(rewards[-5:]) / len(rewards[-5:]) if rewards else None,
        "mean_step_s": sum(step_times) / len(step_times) if step_times else None,
        "elapsed_s": elapsed_s,
        "last_eval": evals,
        "adapter": str(adapter) if adapter else None,
        "adapter_merged_in": merged_in,
    }


def _number(value: Any) -> bool:
    """A finite number: what the summary averages (a record holds None for NaN or inf)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def summary_text(summary: Mapping[str, Any]) -> str:
    def num(value: float | None, fmt: str = "{:.3f}") -> str:
        return "n/a" if value is None else fmt.format(value)

    lines = [
        "=" * 60,
        "GRPO LoRA run finished",
        f"  steps logged        {summary['steps']}",
        f"  reward first 5      {num(summary['reward_first5'])}",
        f"  reward last 5       {num(summary['reward_last5'])}",
        f"  mean step time      {num(summary['mean_step_s'], '{:.2f} s')}",
        f"  wall time (this run) {num(summary['elapsed_s'], '{:.1f} s')}",
    ]
    lines += [f"  {key:<19} {num(value)}" for key, value in sorted(summary["last_eval"].items())]
    lines.append(f"  adapter             {summary['adapter'] or 'not saved'}")
    if dtype := summary["adapter_merged_in"]:
        lines.append(f"  policy              the adapter merged into the base in {dtype}")
    lines.append("=" * 60)
    return "\n".join(lines)


def write_summary(output_dir: Path, summary: Mapping[str, Any]) -> None:
    with _one_line(output_dir / SUMMARY_FILE):
        owned_files.write_atomic(output_dir / SUMMARY_FILE, json.dumps(summary, indent=2) + "\n")
