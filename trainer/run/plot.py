"""Render a run's main curves from its metrics.jsonl to a PNG.

`python -m trainer.run.plot <output-dir>/metrics.jsonl -o curves.png`
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trainer.run.metrics import MetricsError, parse_metrics, torn_tail

# (title, metric keys drawn in that panel)
PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("reward", ("rollout/reward_mean",)),
    ("eval score", ("eval/*",)),
    ("KL to reference", ("train/kl",)),
    ("response length", ("rollout/response_len_mean",)),
    ("truncation ratio", ("rollout/truncated_ratio",)),
    ("entropy", ("train/entropy",)),
    ("clip fraction", ("train/pg_clipfrac",)),
    ("|train - rollout| log-prob", ("train/train_rollout_logprob_abs_diff",)),
    ("grad norm", ("train/grad_norm",)),
    ("time per step (s)", ("time/step",)),
)


def read_records(path: Path) -> tuple[list[dict[str, Any]], str | None]:
    """The records of `path` and the note on a torn last line they leave out (or None)."""
    records = parse_metrics(path)[0]
    if not records:
        raise MetricsError(f"{path}: no metrics records")
    return records, torn_tail(path)


def check_output(path: Path) -> None:
    """`path` names an image format matplotlib writes (by its extension)."""
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    if path.suffix[1:].lower() not in formats:
        raise MetricsError(
            f"-o {path}: end it in .png or another image format matplotlib writes "
            f"({', '.join(sorted(formats))})"
        )


def series(records: Sequence[Mapping[str, Any]], pattern: str) -> dict[str, tuple[list, list]]:
    """key -> (steps, values) for the keys matching `pattern` (a trailing ``*`` is a prefix)."""
    keys = sorted(
        {
            k
            for r in records
            for k in r
            if (k.startswith(pattern[:-1]) if pattern.endswith("*") else k == pattern)
        }
    )
    out = {}
    for key in keys:
        points = [(r["step"] + 1, r[key]) for r in records if r.get(key) is not None]
        out[key] = ([s for s, _ in points], [v for _, v in points])
    return out


def render(records: Sequence[Mapping[str, Any]], output: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = 2
    rows = (len(PANELS) + columns - 1) // columns
    fig, axes = plt.subplots(rows, columns, figsize=(11, 2.6 * rows), squeeze=False)
    for ax, (title, patterns) in zip(axes.flat, PANELS, strict=False):
        drawn = False
        for pattern in patterns:
            for key, (steps, values) in series(records, pattern).items():
                ax.plot(steps, values, marker="." if len(steps) < 50 else None, label=key)
                drawn = True
        if title == "reward" and drawn:
            std = series(records, "rollout/reward_std").get("rollout/reward_std")
            mean = series(records, "rollout/reward_mean")["rollout/reward_mean"]
            if std and len(std[1]) == len(mean[1]):
                low = [m - s for m, s in zip(mean[1], std[1], strict=True)]
                high = [m + s for m, s in zip(mean[1], std[1], strict=True)]
                ax.fill_between(mean[0], low, high, alpha=0.2)
        ax.set_title(title)
        ax.set_xlabel("rollout")
        if not drawn:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
        elif title == "eval score":
            ax.legend(fontsize="small")
    for ax in list(axes.flat)[len(PANELS) :]:
        ax.axis("off")
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=100)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.run.plot", description=__doc__.splitlines()[0], allow_abbrev=False
    )
    parser.add_argument("metrics", type=Path, help="a run's metrics.jsonl")
    parser.add_argument("-o", "--output", type=Path, default=Path("curves.png"))
    args = parser.parse_args(argv)
    try:
        check_output(args.output)
        if not args.metrics.is_file():
            raise MetricsError(f"{args.metrics}: no such file")
        records, note = read_records(args.metrics)
        if note:
            print(f"{parser.prog}: {note}", file=sys.stderr)
        render(records, args.output)
    except MetricsError as err:
        print(f"{parser.prog}: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        reason = f"-o {args.output}: cannot write it ({err.strerror or err})"
        print(f"{parser.prog}: error: {reason}", file=sys.stderr)
        return 2
    print(f"{len(records)} steps -> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
