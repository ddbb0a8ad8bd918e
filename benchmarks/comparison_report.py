"""The comparison's report: each system's step times, throughput, memory and phases, the
ratios to ours and the rollouts against the decode bound, from the results the benchmark keeps
(also those of a saved ``--json``: `grpo_vs_trl.py --report`)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from benchmarks.decode_bound import bound_bandwidth, count_params, decode_bound

if TYPE_CHECKING:
    from benchmarks.workload import Spec, StepTime

GIB = 2**30


def summary(times: list[StepTime]) -> dict[str, float]:
    steps = [t.step_s for t in times]
    rollout = sum(t.rollout_s for t in times)
    train = sum(t.step_s - t.rollout_s for t in times)
    return {
        "median": statistics.median(steps),
        "min": min(steps),
        "max": max(steps),
        "rollout_tps": sum(t.response_tokens for t in times) / rollout if rollout else 0.0,
        "train_tps": sum(t.total_tokens for t in times) / train if train else 0.0,
    }


def phase_medians(times: list[dict[str, Any]]) -> list[tuple[str, float]]:
    """Median of every phase (seconds) and check metric the steps of one system recorded."""
    names = sorted({name for t in times for name in t["phases"]})
    return [
        (name, statistics.median(t["phases"][name] for t in times if name in t["phases"]))
        for name in names
    ]


def completed(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The systems that took their steps (with `--one-at-a-time`, one may have failed)."""
    return {kind: r for kind, r in results.items() if "failed" not in r}


def ratios(results: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Every other system's median step time over ours' (how many times faster ours is)."""
    done = completed(results)
    if "ours" not in done:
        return {}
    ours = done["ours"]["summary"]["median"]
    return {kind: r["summary"]["median"] / ours for kind, r in done.items() if kind != "ours"}


def report(
    spec: Spec,
    results: dict[str, dict[str, Any]],
    hbm_tbps: float | None,
    *,
    machine: str,
    alone: bool = False,
    earlier: Sequence[str] = (),
) -> None:
    """Print the run's table; `machine`: the device and its cores ("NVIDIA H200, 16 cores");
    `alone`: each system ran by itself (`--one-at-a-time`); `hbm_tbps`: ``--hbm-tbps``, else
    the device's own (`device_hbm_tbps`); `earlier`: the systems whose results came from an
    earlier command (`--resume`)."""
    cuda = spec.device.startswith("cuda")
    done = completed(results)
    per_process = all(r["per_process"] for r in done.values())
    unit = "GiB (RSS)" if not cuda else "GiB (NVML)"
    others = "" if alone else ", other idle included"
    where = "each system's process tree" if per_process else f"device above idle{others}"
    print(f"\n{machine}")
    for name, r in done.items():
        print(f"{name}: " + ", ".join(f"{k} {v}" for k, v in r["versions"].items()))
    if "trl-vllm" in results:
        print(f"trl-vllm: vLLM's sleep mode {'on' if spec.vllm_sleep else 'off'}")
    if "verl" in results:
        print(
            "verl: its own loop, unpaced: a step is the wall time between two of its logged "
            "steps (start-up in its first warm-up step); torch alloc: its FSDP actor's peak"
        )
    print(
        "systems: one at a time, each alone on the device"
        if alone
        else "systems: side by side, timed steps in turn"
    )
    if earlier:
        print(f"from an earlier command on this kind of device (--resume): {', '.join(earlier)}")
    print(
        f"{spec.prompts} prompts x {spec.samples} samples, {spec.prompt_len} prompt + "
        f"{spec.response_len} response tokens, LoRA r=64 all-linear, "
        f"{'tiny model' if spec.tiny else spec.shape + ' shape'}, {spec.device}, gradient "
        f"checkpointing {'on' if spec.gradient_checkpointing else 'off'}, KV cache "
        f"{'in the model dtype' if spec.kv_cache_dtype == 'auto' else spec.kv_cache_dtype}"
    )
    header = (
        f"{'system':<8} {'steps':>5} {'median s':>9} {'min s':>8} {'max s':>8} "
        f"{'rollout tok/s':>14} {'train tok/s':>12} {'peak ' + unit:>28} {'torch alloc GiB':>16} "
        f"{'torch reserved GiB':>19}"
    )
    print(header)
    for name, r in results.items():
        if "failed" in r:
            verdict = "does not fit (out of memory)" if r["out_of_memory"] else "failed"
            print(f"{name:<8} {verdict} at {r['stage']}: {r['failed']}")
            continue
        s = r["summary"]
        peak = f"{r['peak'] / GIB:.2f}"
        allocated = "n/a" if not cuda or r["allocated"] is None else f"{r['allocated'] / GIB:.2f}"
        reserved = "n/a" if r["reserved"] is None else f"{r['reserved'] / GIB:.2f}"
        print(
            f"{name:<8} {len(r['times']):>5} {s['median']:>9.3f} {s['min']:>8.3f} "
            f"{s['max']:>8.3f} {s['rollout_tps']:>14.0f} {s['train_tps']:>12.0f} "
            f"{peak:>28} {allocated:>16} {reserved:>19}"
        )
    print(
        f"peak memory: {where}; torch alloc / reserved: the worker process's own tensors / "
        "its caching allocator's segments"
    )
    if per_process:
        print(
            "at its peak, the worker process itself / its child processes (GiB): "
            + ", ".join(
                f"{name} {r['peak_own'] / GIB:.2f} / {(r['peak'] - r['peak_own']) / GIB:.2f}"
                for name, r in done.items()
            )
        )
    for name, r in done.items():
        by_phase = sorted((r.get("peak_by_phase") or {}).items(), key=lambda kv: -kv[1])
        if len(by_phase) > 1:  # the system named its phases: verl's never reach the sampler
            print(
                f"{name} peak by phase, as the peak column, highest first (GiB): "
                + ", ".join(f"{phase} {peak / GIB:.2f}" for phase, peak in by_phase)
            )
    for name, r in done.items():
        phases = phase_medians(r["times"])
        if phases:
            print(f"{name} per step (median): " + ", ".join(f"{k} {v:.3f}" for k, v in phases))
    for name, ratio in ratios(results).items():
        print(f"ratio ({name} median / ours median): {ratio:.2f}x")
    if not spec.tiny:
        bandwidth, source = bound_bandwidth(hbm_tbps, machine.rsplit(", ", 1)[0])
        if bandwidth is None:
            print(f"roofline: no decode bound, the HBM bandwidth is {source}")
            return
        base, lora = count_params(spec)
        bound = decode_bound(spec, bandwidth, base, lora)
        for name, r in done.items():
            measured = r["summary"]["rollout_tps"]
            print(
                f"roofline {name}: rollout {measured:.0f} tok/s vs HBM bound {bound:.0f} tok/s "
                f"at {source} (weights {2 * (base + lora) / GIB:.2f} GiB + KV per decode "
                f"step) = {measured / bound:.1%}"
            )
