"""The GRPO-vs-TRL benchmark's arithmetic and argument checks (it asserts nothing on time)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from benchmarks import (
    comparison_report,
    decode_bound,
    ours_system,
    peak_memory,
    trl_system,
    workload,
)
from benchmarks.system_worker import SystemPath
from trainer.job.memory_estimate import DeviceMemory
from trainer.tiny import parity, vocabulary

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("grpo_vs_trl", ROOT / "benchmarks/grpo_vs_trl.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def full_spec(bench, **changes):
    values = {
        "work": "", "device": "cuda", "tiny": False, "prompts": 8, "samples": 8,
        "prompt_len": 256, "response_len": 512, "micro_batch": 16, "lr": 2e-5, "seed": 0,
        "rollout_backend": "sglang", **changes,
    }  # fmt: skip
    return bench.Spec(**values)


@pytest.mark.parametrize(
    ("shape", "expected"),
    [("qwen3-0.6b", (596_049_920, 40_370_176)), ("qwen3-4b", (4_022_468_096, 132_120_576))],
)
def test_parameter_counts_match_the_model_and_adapter(bench, shape, expected):
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen3Config, Qwen3ForCausalLM

    spec = full_spec(bench, shape=shape)
    with torch.device("meta"):
        model = Qwen3ForCausalLM(Qwen3Config(**spec.model_shape, tie_word_embeddings=True))
        base = sum(p.numel() for p in model.parameters())
        lora = get_peft_model(model, LoraConfig(r=64, target_modules=workload.TARGETS))
        adapter = sum(p.numel() for p in lora.parameters() if p.requires_grad)
    assert decode_bound.count_params(spec) == (base, adapter) == expected


def test_decode_bound(bench):
    spec = full_spec(bench)
    base, lora = decode_bound.count_params(spec)
    # 1.27 GB of weights + 64 x 512 tokens x 114,688 KV bytes per decode step at 4.8 TB/s
    per_step = (2 * (base + lora) + 64 * 512 * 114_688) / 4.8e12
    assert decode_bound.decode_bound(spec, 4.8, base, lora) == pytest.approx(64 / per_step)
    assert decode_bound.decode_bound(spec, 9.6, base, lora) == pytest.approx(2 * 64 / per_step)
    # an 8-bit KV cache: half the KV bytes per decode step
    fp8 = full_spec(bench, kv_cache_dtype="fp8")
    per_step = (2 * (base + lora) + 64 * 512 * 114_688 / 2) / 4.8e12
    assert decode_bound.decode_bound(fp8, 4.8, base, lora) == pytest.approx(64 / per_step)


def test_summary(bench):
    times = [
        bench.StepTime(step_s=3.0, rollout_s=2.0, response_tokens=100, total_tokens=300),
        bench.StepTime(step_s=5.0, rollout_s=2.0, response_tokens=100, total_tokens=300),
        bench.StepTime(step_s=4.0, rollout_s=4.0, response_tokens=200, total_tokens=400),
    ]
    s = bench.summary(times)
    assert (s["median"], s["min"], s["max"]) == (4.0, 3.0, 5.0)
    assert s["rollout_tps"] == pytest.approx(400 / 8)
    assert s["train_tps"] == pytest.approx(1000 / 4)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--micro-batch", "7"], "--micro-batch 7 does not divide 64 samples"),
        (["--systems", "ours,vllm"], "a comma list of ours, trl, trl-vllm"),
        (["--steps", "0"], "--steps must be >= 1"),
        (["--trl-steps", "0"], "--steps must be >= 1 (every --SYSTEM-steps too)"),
        (["--systems", "ours,trl-vllm"], "--systems trl-vllm: vLLM needs --device cuda"),
        (["--trl-vllm-path", "/no/such/dir"], "--trl-vllm-path: /no/such/dir is not a directory"),
        (["--systems", "ours,unsloth"], "--systems unsloth: vLLM needs --device cuda"),
        (["--systems", "verl", "--one-at-a-time"], "--systems verl: vLLM needs --device cuda"),
        (["--verl-path", "/no/such/dir"], "--verl-path: /no/such/dir is not a directory"),
        (["--vllm-memory", "1.5"], "--vllm-memory 1.5: a share of the GPU, in (0, 1]"),
        (
            ["--kv-cache-dtype", "fp8"],
            "--kv-cache-dtype fp8: trl keep the KV cache in the model's dtype (TRL 1.15 passes "
            "no KV-cache format to vLLM; transformers' generate has none): leave them out of "
            "--systems",
        ),
        (
            ["--kv-cache-dtype", "fp8", "--systems", "ours"],
            "--kv-cache-dtype fp8: ours' transformers engine (the CPU's, or --rollout-backend "
            "hf) keeps the KV cache in the model's dtype: run ours with SGLang on --device cuda",
        ),
        (
            ["--response-len", "500"],
            "--prompt-len 16 + --response-len 500 tokens: over the 512 positions of the tiny model",
        ),
        (["--inputs-only"], "--inputs-only: give --inputs DIR, the folder to build them in"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(bench, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        bench.parse(["--device", "cpu", "--tiny", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]


def test_both_systems_get_the_same_varying_reward(bench):
    from trainer.arguments import parse_args
    from trainer.grpo.rewards import RewardSample
    from trainer.loop import _user_function

    args = parse_args(ours_system.ours_argv(full_spec(bench, work="/w"), steps=1))
    ours = _user_function(args.reward.custom_rm_path)
    texts = ["t7 t81", "t7 t812", "t70 t812"]
    rewards = [ours(args.miles_args(), RewardSample("p", text, "label")) for text in texts]
    assert rewards == [parity(text) for text in texts] == [0.0, 1.0, 0.0]


def test_the_4b_shape_builds_its_whole_vocabulary(bench):
    spec = full_spec(bench, shape="qwen3-4b")
    tokenizer = workload.build_tokenizer(spec, eos=False)
    assert len(tokenizer) == 151936 and tokenizer.eos_token is None
    words = workload.prompt_words(spec)
    assert len(words) == 151936 - len(vocabulary()) - 1 and words[0].startswith("t")
    assert words[-1] == "t151934"  # the last id is the newline's


@pytest.mark.parametrize("shape", ["qwen3-0.6b", "qwen3-4b"])
def test_the_newline_is_one_token_of_the_model_s_vocabulary(bench, shape):
    """As in Qwen's tokenizers; verl's rollout for a `qwen3` model refuses a tokenizer without
    it ("Expected Qwen newline to tokenize to one token, got []")."""
    spec = full_spec(bench, shape=shape)
    tokenizer = workload.build_tokenizer(spec, eos=False)
    (newline,) = tokenizer.encode("\n", add_special_tokens=False)
    assert newline == spec.model_shape["vocab_size"] - 1 == len(tokenizer) - 1
    words = tokenizer.encode("t20\nt21 t22", add_special_tokens=False)
    assert words == [20, newline, 21, 22]
    assert tokenizer.decode(words) == "t20 \n t21 t22"
    assert "\n" not in workload.prompt_words(spec)


def test_phase_medians(bench):
    times = [
        {"phases": {"rollout": 2.0, "train": 1.0}},
        {"phases": {"rollout": 4.0, "train": 3.0}},
        {"phases": {"rollout": 3.0}},
    ]
    assert comparison_report.phase_medians(times) == [("rollout", 3.0), ("train", 2.0)]


def vllm_settings(config) -> tuple[bool, str, bool]:
    """How a TRL config generates: with vLLM, in which mode, put to sleep while training."""
    return config.use_vllm, config.vllm_mode, config.vllm_enable_sleep_mode


def tiny_spec(bench, work, **changes):
    values = {
        "work": str(work), "device": "cpu", "tiny": True, "prompts": 8, "samples": 8,
        "prompt_len": 16, "response_len": 32, "micro_batch": 16, "lr": 2e-5, "seed": 0,
        "rollout_backend": "hf", **changes,
    }  # fmt: skip
    return bench.Spec(**values)


def test_trl_vllm_config_generates_with_colocated_vllm_and_ignores_eos(bench, tmp_path):
    pytest.importorskip("trl")
    spec = tiny_spec(bench, tmp_path)
    config = trl_system.trl_config(spec, steps=3, kind="trl-vllm")
    eos = workload.build_tokenizer(spec, eos=True).eos_token_id
    assert vllm_settings(config) == (True, "colocate", True)
    assert config.vllm_gpu_memory_utilization == 0.3  # TRL's default
    assert config.generation_kwargs == {"min_tokens": 32, "stop_token_ids": [eos]}
    baseline = trl_system.trl_config(spec, steps=3, kind="trl")
    assert not baseline.use_vllm and baseline.generation_kwargs == {"min_new_tokens": 32}
    same = ("learning_rate", "per_device_train_batch_size", "gradient_accumulation_steps")
    same += ("steps_per_generation", "num_generations", "max_completion_length", "beta")
    same += ("max_steps", "num_iterations", "temperature", "gradient_checkpointing")
    assert {k: getattr(config, k) for k in same} == {k: getattr(baseline, k) for k in same}
    assert config.generation_batch_size == 64 and config.beta == 0.0


class StandInLLM:
    """vLLM's `LLM` as far as TRL 1.16's colocate mode uses it (trl/generation/vllm_generation.py):
    it records what TRL asks and answers every prompt with `max_tokens` of the prompt's tokens."""

    def __init__(self, model: str, **kwargs) -> None:
        StandInLLM.made = self
        self.kwargs = kwargs
        self.events: list[tuple] = []
        self.sampling: list = []
        runner = SimpleNamespace(model=SimpleNamespace(load_weights=self.load_weights))
        worker = SimpleNamespace(model_runner=runner)
        self.llm_engine = SimpleNamespace(model_executor=SimpleNamespace(driver_worker=worker))

    def load_weights(self, weights: list) -> None:
        self.events += [("load", name) for name, _ in weights]

    def sleep(self, level: int) -> None:
        self.events.append(("sleep", level))

    def wake_up(self, tags: list[str]) -> None:
        self.events.append(("wake", *tags))

    def reset_prefix_cache(self) -> None:
        self.events.append(("reset",))

    def generate(self, prompts: list[dict], sampling_params, use_tqdm: bool) -> list:
        self.sampling.append(sampling_params)
        outputs = []
        for prompt in prompts:
            ids = prompt["prompt_token_ids"]
            tokens = [ids[i % len(ids)] for i in range(sampling_params.max_tokens)]
            logprobs = [{t: SimpleNamespace(rank=1, logprob=-1.0)} for t in tokens]
            completion = SimpleNamespace(token_ids=tokens, logprobs=logprobs)
            outputs.append(SimpleNamespace(prompt_token_ids=ids, outputs=[completion]))
        return outputs


class Commands:
    """The parent's end of a worker's pipe: hands out `commands`, keeps what the worker sends."""

    def __init__(self, commands: list[str]) -> None:
        self.commands = commands
        self.sent: list = []

    def recv(self) -> str:
        return self.commands.pop(0)

    def send(self, message) -> None:
        self.sent.append(message)


@pytest.mark.timeout(300)
def test_the_trl_vllm_worker_syncs_once_per_step_through_trls_own_vllm_glue(
    bench, tmp_path, monkeypatch
):
    """TRL's colocated-vLLM code with a stand-in engine: the methods the worker times exist and
    run once a step, and every response is asked for at full length with EOS masked."""
    vllm_generation = pytest.importorskip("trl.generation.vllm_generation")
    monkeypatch.setattr(vllm_generation, "is_vllm_available", lambda *_, **__: True)
    monkeypatch.setattr(vllm_generation, "LLM", StandInLLM, raising=False)
    if not hasattr(vllm_generation, "SamplingParams"):  # no vLLM here: keep the arguments
        monkeypatch.setattr(vllm_generation, "SamplingParams", SimpleNamespace, raising=False)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(name, "")  # TRL sets them for vLLM: restored afterwards
        monkeypatch.delenv(name)
    spec = tiny_spec(bench, tmp_path)
    bench.prepare_inputs(spec, rows=spec.prompts * 4)
    commands = Commands(["reset", "step", "step"])
    memory = peak_memory.PeakMemory("cpu", 0)
    trl_system.run_trl(spec, "trl-vllm", 2, commands, memory)
    memory.stop()
    assert set(memory.peak_by_phase) == {"rollout", "sync_weights", "rest"}

    engine = StandInLLM.made
    assert engine.kwargs["distributed_executor_backend"] == "external_launcher"
    assert engine.kwargs["enable_sleep_mode"] and engine.kwargs["gpu_memory_utilization"] == 0.3
    assert engine.kwargs["max_num_seqs"] == spec.prompts * spec.samples
    assert os.environ["RANK"] == "0" and os.environ["WORLD_SIZE"] == "1"
    eos = workload.build_tokenizer(spec, eos=True).eos_token_id
    assert len(engine.sampling) == 2
    for params in engine.sampling:
        assert params.max_tokens == params.min_tokens == spec.response_len
        assert list(params.stop_token_ids) == [eos] and params.n == 1
    events = [e for e in engine.events if e[0] != "load"]
    step = [("wake", "weights"), ("reset",), ("wake", "kv_cache"), ("sleep", 2)]
    assert events == [("sleep", 2), *step, *step]
    loaded = [event[1] for event in engine.events if event[0] == "load"]
    assert len(loaded) == 2 * len(set(loaded))  # every weight, once a step
    assert not [n for n in loaded if "lora_" in n or "base_layer" in n or "lm_head" in n]
    assert commands.sent[0][0] == "ready"
    for sent in commands.sent[1:]:
        assert list(sent["phases"]) == ["sync_weights"] and sent["phases"]["sync_weights"] > 0
        assert sent["response_tokens"] == spec.prompts * spec.samples * spec.response_len


def test_each_system_gets_its_own_steps_and_path(bench, tmp_path):
    pytest.importorskip("trl")
    argv = ["--device", "cpu", "--tiny", "--steps", "4", "--trl-steps", "2"]
    (tmp_path / "vllm").mkdir()
    paths = ["--trl-path", f"{tmp_path}{os.pathsep}{tmp_path}"]
    paths += ["--trl-vllm-path", f"{tmp_path}/vllm"]
    options, _ = bench.parse([*argv, *paths])
    assert options.steps == {"ours": 4, "trl": 2}
    assert options.paths == {
        "ours": SystemPath([], [str(tmp_path), f"{tmp_path}/vllm"]),
        "trl": SystemPath([str(tmp_path), str(tmp_path)], [f"{tmp_path}/vllm"]),
    }


def test_a_system_path_is_searched_for_its_packages(bench, tmp_path, monkeypatch):
    spec = full_spec(bench)
    assert any(
        m.startswith("vllm for trl-vllm")
        for m in bench.missing_packages(spec, {"trl-vllm": SystemPath()})
    )
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("")
    found = {"trl-vllm": SystemPath([str(tmp_path)]), "ours": SystemPath()}
    assert not any(m.startswith("vllm") for m in bench.missing_packages(spec, found))
    # on this process's path, but another system's target: not the worker's
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    hidden = {"trl-vllm": SystemPath([], [f"{tmp_path}/"])}
    assert any(m.startswith("vllm for trl-vllm") for m in bench.missing_packages(spec, hidden))


def test_a_worker_imports_from_its_own_target_and_none_of_the_others(monkeypatch):
    """Its folders first on `sys.path` and on the `PYTHONPATH` its processes inherit; another
    system's target off both, however it is spelled (verl's vLLM once imported SGLang's
    FlashInfer kernels from the parent's `PYTHONPATH`)."""
    monkeypatch.setattr(sys, "path", ["", "/b", "/tmp/site/", "/d"])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/tmp/site", "/c"]))
    SystemPath(["/a1", "/a2"], ["/tmp/site"]).use()
    assert sys.path == ["/a1", "/a2", "", "/b", "/d"]
    assert os.environ["PYTHONPATH"] == os.pathsep.join(["/a1", "/a2", "/c"])
    monkeypatch.setenv("PYTHONPATH", "/tmp/site")
    SystemPath([], ["/tmp/site"]).use()
    assert "PYTHONPATH" not in os.environ


@pytest.mark.timeout(180)
def test_one_at_a_time_a_failing_system_is_reported_and_the_others_still_run(
    bench, tmp_path, monkeypatch, capsys
):
    """`--one-at-a-time` (for shapes whose systems do not fit one device together): trl's
    worker fails at its start, importing the broken `trl` its own `--trl-path` puts first; ours
    then runs alone and is reported; no ratio without both."""
    pytest.importorskip("trl")
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    shadow = tmp_path / "extra" / "trl"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('the trl of the extra path')\n")
    out = tmp_path / "results.json"
    argv = ["--device", "cpu", "--tiny", "--systems", "trl,ours", "--one-at-a-time"]
    argv += ["--steps", "1", "--warmup", "0", "--trl-path", str(tmp_path / "extra")]
    bench.main([*argv, "--json", str(out)])
    printed = capsys.readouterr().out
    assert "trl: failed at start: ImportError: the trl of the extra path" in printed
    assert "trl      failed at start: ImportError: the trl of the extra path" in printed
    assert "systems: one at a time, each alone on the device" in printed
    assert "ratio" not in printed
    document = json.loads(out.read_text())
    assert document["one_at_a_time"] and document["ratios"] == {} and document["pending"] == []
    assert document["results"]["trl"] == {
        "failed": "ImportError: the trl of the extra path",
        "stage": "start",
        "out_of_memory": False,
    }
    ours = document["results"]["ours"]
    assert len(ours["times"]) == 1 and ours["times"][0]["response_tokens"] == 64 * 32
    assert ours["peak"] > 0


@pytest.mark.timeout(180)
def test_one_at_a_time_a_stopped_run_keeps_what_ran_and_resumes_with_the_rest(
    bench, tmp_path, monkeypatch, capsys
):
    """A run stopped after its first system (a node's time limit, Ctrl-C) leaves that system's
    results in `--json`, the others named as pending; `--resume` starts only those and reports
    every system (here trl fails at its start, a stand-in: the resume's bookkeeping is checked,
    not trl)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    start = bench.start_worker
    started = []

    def stopped_before_trl(kind, *args):
        if kind == "trl":
            raise KeyboardInterrupt
        return start(kind, *args)

    def trl_fails(kind, *args):
        started.append(kind)
        raise bench.WorkerFailed(kind, "Traceback ...\nRuntimeError: the stand-in trl")

    out = tmp_path / "results.json"
    argv = ["--device", "cpu", "--tiny", "--systems", "ours,trl", "--one-at-a-time"]
    argv += ["--steps", "1", "--warmup", "0", "--json", str(out)]
    monkeypatch.setattr(bench, "start_worker", stopped_before_trl)
    with pytest.raises(KeyboardInterrupt):
        bench.main(argv)
    first = json.loads(out.read_text())
    assert first["pending"] == ["trl"]
    assert len(first["results"]["ours"]["times"]) == 1
    capsys.readouterr()

    monkeypatch.setattr(bench, "start_worker", trl_fails)
    bench.main([*argv, "--resume"])
    assert started == ["trl"]
    resumed = json.loads(out.read_text())
    assert resumed["pending"] == [] and resumed["machine"] == first["machine"]
    assert resumed["results"]["ours"] == first["results"]["ours"]
    assert resumed["results"]["trl"]["failed"] == "RuntimeError: the stand-in trl"
    printed = capsys.readouterr().out
    assert "from an earlier command on this kind of device (--resume): ours" in printed
    assert re.search(r"^ours +1 ", printed, re.MULTILINE)
    assert "trl      failed at start: RuntimeError: the stand-in trl" in printed


def hang_after_starting_a_process(pid_file: str) -> None:
    """A worker that stops answering, having started a process of its own (as verl's worker
    starts a Ray cluster and the engines): what ``--step-timeout`` ends."""
    started = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    Path(pid_file).write_text(str(started.pid))
    time.sleep(300)


def ended(pid: int) -> bool:
    psutil = pytest.importorskip("psutil")
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # nobody here reaps it
    except psutil.NoSuchProcess:
        return True


@pytest.mark.timeout(120)
def test_a_worker_that_stops_answering_fails_and_its_processes_end(bench, tmp_path):
    """With a timeout (``--step-timeout``) the wait for a worker's answer ends in a failure
    that names it, and stopping the worker ends the processes it started too, so that the next
    system (``--one-at-a-time``) has the GPU to itself. verl's first run hung so, its vLLM
    worker failed while verl waited on it."""
    import multiprocessing

    pid_file = tmp_path / "started.pid"
    process = multiprocessing.get_context("fork").Process(
        target=hang_after_starting_a_process, args=(str(pid_file),)
    )
    process.start()
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline, "the stand-in worker did not start its process"
        time.sleep(0.05)
    started = int(pid_file.read_text())

    w = object.__new__(bench.Worker)  # its process and pipe, without spawning a system
    w.kind, w.timeout, w.process = "verl", 0.5, process
    w.conn, _ = multiprocessing.Pipe()
    with pytest.raises(bench.WorkerFailed) as failure:
        w.receive()
    assert failure.value.reason == "no answer within 0.5 s (--step-timeout)"
    w.stop()
    assert not process.is_alive()
    assert ended(started)


def test_step_timeout_reaches_every_worker_and_must_be_positive(bench, monkeypatch, capsys):
    made = []

    class Recorded:
        def __init__(self, *args):
            made.append(args)

    options, spec = bench.parse(["--device", "cpu", "--tiny", "--step-timeout", "900"])
    monkeypatch.setattr(bench, "Worker", Recorded)
    bench.start_worker("ours", options, spec, 0)
    assert made[0][-1] == 900.0
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        bench.parse(["--device", "cpu", "--tiny", "--step-timeout", "0"])
    assert exit_info.value.code == 2
    assert "--step-timeout 0: seconds, more than 0" in capsys.readouterr().err


def test_inputs_keep_the_model_for_the_next_run_of_its_shape_and_seed(bench, tmp_path):
    """`--inputs DIR`: the model built once is reused by a later run of the same shape and seed
    (its files untouched), rebuilt for another seed; the prompts are written for each run."""
    inputs = tmp_path / "inputs"
    argv = ["--device", "cpu", "--tiny", "--inputs", str(inputs)]
    _, spec = bench.parse(argv)
    spec.work = str(tmp_path / "run-1")
    assert bench.prepare_inputs(spec, rows=8).startswith("built model and prompts in ")
    weights = Path(spec.model_dir) / "model.safetensors"
    built = weights.stat().st_mtime_ns
    assert len(Path(spec.prompt_file).read_text().splitlines()) == 8

    _, again = bench.parse(argv)
    again.work = str(tmp_path / "run-2")
    assert bench.prepare_inputs(again, rows=16).startswith(f"model reused from {inputs / 'model'}")
    assert weights.stat().st_mtime_ns == built
    assert len(Path(again.prompt_file).read_text().splitlines()) == 16

    _, other = bench.parse([*argv, "--seed", "7"])
    other.work = str(tmp_path / "run-3")
    assert bench.prepare_inputs(other, rows=8).startswith("built model and prompts in ")
    assert weights.stat().st_mtime_ns != built


def test_inputs_only_builds_the_inputs_and_runs_no_system(bench, tmp_path, capsys):
    """`--inputs-only`: the model and the prompts a run of these arguments would use (its warm-up
    and timed steps' worth) are in --inputs, and nothing else ran or printed."""
    inputs = tmp_path / "inputs"
    argv = ["--device", "cpu", "--tiny", "--warmup", "1", "--steps", "2", "--inputs", str(inputs)]
    bench.main([*argv, "--inputs-only"])
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 1 and printed[0].startswith("built model and prompts in ")
    _, spec = bench.parse(argv)
    assert json.loads((inputs / "model" / "benchmark-model.json").read_text()) == spec.model_key
    assert len((inputs / "prompts.jsonl").read_text().splitlines()) == spec.prompts * (1 + 2 + 2)
    assert sorted(p.name for p in inputs.iterdir()) == ["model", "prompts.jsonl"]


@pytest.mark.parametrize(
    ("argv", "earlier", "message"),
    [
        (["--prompt-len", "24"], {}, "ran another workload (prompt_len differ)"),
        ([], {"machine": "NVIDIA H200, 16 cores"}, "ran on NVIDIA H200, 16 cores, not on this CPU"),
        ([], {"one_at_a_time": False}, "is not the JSON of a --one-at-a-time run"),
        (["--json", "/no/such/results.json"], {}, "cannot read /no/such/results.json"),
    ],
)
def test_resume_refuses_another_workload_or_device_in_one_line(
    bench, tmp_path, capsys, argv, earlier, message
):
    out = tmp_path / "results.json"
    base = ["--device", "cpu", "--tiny", "--systems", "ours,trl", "--one-at-a-time"]
    options, spec = bench.parse([*base, "--json", str(out)])
    bench.write_json(options, spec, {})
    out.write_text(json.dumps({**json.loads(out.read_text()), **earlier}))
    with pytest.raises(SystemExit) as exit_info:
        bench.parse([*base, "--json", str(out), *argv, "--resume"])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]


def test_resume_takes_a_field_added_since_the_json_as_its_default(bench, tmp_path):
    """A run saved before `kv_cache_dtype` existed ran its KV cache in the model's dtype."""
    out = tmp_path / "results.json"
    argv = ["--device", "cpu", "--tiny", "--systems", "ours,trl", "--one-at-a-time"]
    options, spec = bench.parse([*argv, "--json", str(out)])
    bench.write_json(options, spec, {"ours": {"failed": "x"}})
    document = json.loads(out.read_text())
    del document["spec"]["kv_cache_dtype"]
    out.write_text(json.dumps(document))
    assert bench.earlier_results(options, spec) == {"ours": {"failed": "x"}}


def test_resume_needs_the_one_at_a_time_runs_json(bench, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.parse(["--device", "cpu", "--tiny", "--resume"])
    assert exit_info.value.code == 2
    assert "--resume: continues an earlier --one-at-a-time run" in capsys.readouterr().err


@pytest.mark.timeout(180)
def test_side_by_side_the_json_holds_every_system_once_they_all_stepped(
    bench, tmp_path, monkeypatch
):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    out = tmp_path / "results.json"
    argv = ["--device", "cpu", "--tiny", "--systems", "ours", "--steps", "1", "--warmup", "0"]
    bench.main([*argv, "--json", str(out)])
    document = json.loads(out.read_text())
    assert not document["one_at_a_time"] and document["pending"] == []
    ours = document["results"]["ours"]
    assert len(ours["times"]) == 1
    by_phase = ours["peak_by_phase"]  # the loop's timed phases; its step is what is watched
    assert {"rollout", "logprobs", "train", "rest"} <= set(by_phase) and "step" not in by_phase
    assert max(by_phase.values()) == ours["peak"]


@pytest.mark.parametrize(
    ("argv", "sleep"),
    [([], True), (["--one-at-a-time"], False), (["--one-at-a-time", "--vllm-sleep"], True),
     (["--no-vllm-sleep"], False)],
)  # fmt: skip
def test_vllm_sleeps_where_the_systems_share_the_device(bench, argv, sleep):
    pytest.importorskip("trl")
    _, spec = bench.parse(["--device", "cpu", "--tiny", *argv])
    assert spec.vllm_sleep is sleep
    assert trl_system.trl_config(spec, steps=1, kind="trl-vllm").vllm_enable_sleep_mode is sleep


def test_peak_memory_splits_the_process_tree_at_its_peak(bench):
    memory = peak_memory.PeakMemory("cpu", 0)
    memory.watch()
    child = subprocess.Popen([sys.executable, "-c", "x = bytearray(200 * 2**20); input()"],
                             stdin=subprocess.PIPE)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while memory.peak - memory.peak_own < 200 * 2**20 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        child.communicate(b"\n")
    peak = memory.stop()
    assert 0 < memory.peak_own < peak
    assert peak - memory.peak_own >= 200 * 2**20  # the child's bytearray


def test_peak_memory_samples_only_while_a_step_is_watched(bench):
    memory = peak_memory.PeakMemory("cpu", 0)
    try:
        time.sleep(0.2)
        assert memory.peak == 0  # no step yet: nothing sampled
        memory.watch()
        memory.pause()  # a step shorter than the interval still gets its sample
        assert memory.peak > 0
        between_steps = memory.peak
        grown = bytearray(300 * 2**20)  # between steps: not what a step used
        time.sleep(0.2)
        assert memory.peak == between_steps
        memory.watch()
        deadline = time.monotonic() + 30
        while memory.peak < between_steps + 250 * 2**20 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert memory.peak >= between_steps + 250 * 2**20, len(grown)
    finally:
        memory.stop()


def test_peak_memory_counts_each_named_phase_apart(bench):
    """A phase's peak is its own (the innermost phase counts), and what a step holds outside
    every named phase is the rest."""
    memory = peak_memory.PeakMemory("cpu", 0)
    try:
        memory.watch()
        with memory.phase("rollout"):
            pass  # shorter than the interval: its entry and exit samples
        with memory.phase("train"):
            with memory.phase("logprobs"):
                pass
            grown = bytearray(300 * 2**20)
            deadline = time.monotonic() + 30
            while memory.peak_by_phase["train"] < memory.peak_by_phase["rollout"] + 250 * 2**20:
                assert time.monotonic() < deadline, len(grown)
                time.sleep(0.05)
            del grown
        memory.pause()
    finally:
        memory.stop()
    by_phase = memory.peak_by_phase
    assert set(by_phase) == {"rollout", "train", "logprobs", "rest"}
    assert by_phase["train"] == memory.peak
    assert by_phase["logprobs"] < by_phase["train"] - 250 * 2**20
    assert by_phase["rest"] < by_phase["train"] - 250 * 2**20  # sampled once the bytes were freed
    memory.reset()
    assert memory.peak_by_phase == {}


def test_the_report_compares_ours_with_every_other_system(bench, tmp_path, capsys):
    def result(seconds, versions, reserved=None):
        step = bench.StepTime(
            step_s=seconds, rollout_s=seconds / 2, response_tokens=64, total_tokens=128
        )
        return {
            "times": [bench.asdict(step)], "summary": bench.summary([step]),
            "peak": 2**30, "peak_own": 2**28, "allocated": 0, "reserved": reserved,
            "per_process": True, "versions": versions,
        }  # fmt: skip

    results = {
        "ours": result(2.0, {"sglang": "0.5.17"}),
        "trl": result(8.0, {"trl": "1.16.0"}, reserved=3 * 2**29),
        "trl-vllm": result(3.0, {"trl": "1.16.0", "vllm": "0.26.0"}),
    }
    results["ours"]["peak_by_phase"] = {"rollout": 2**29, "train": 2**30, "rest": 2**28}
    results["trl"]["peak_by_phase"] = {"rest": 2**30}  # no phase named: no line
    assert bench.ratios(results) == {"trl": 4.0, "trl-vllm": 1.5}
    bench.report(tiny_spec(bench, tmp_path), results, 4.8, machine="CPU, 2 cores")
    out = capsys.readouterr().out
    assert "ratio (trl median / ours median): 4.00x" in out
    assert "ratio (trl-vllm median / ours median): 1.50x" in out
    assert "trl-vllm: trl 1.16.0, vllm 0.26.0" in out
    assert "trl-vllm: vLLM's sleep mode on" in out
    assert "systems: side by side, timed steps in turn" in out
    assert "its child processes (GiB): ours 0.25 / 0.75, trl 0.25 / 0.75" in out
    assert (
        "ours peak by phase, as the peak column, highest first (GiB): "
        "train 1.00, rollout 0.50, rest 0.25\n"
    ) in out
    assert "trl peak by phase" not in out
    rows = {line.split()[0]: line.split()[-2:] for line in out.splitlines() if " n/a" in line}
    assert rows == {"ours": ["n/a", "n/a"], "trl": ["n/a", "1.50"], "trl-vllm": ["n/a", "n/a"]}


@pytest.mark.parametrize(
    ("memory", "swaps", "backup"),
    [("release", True, True), ("release-kv", True, False), ("keep", False, False)],
)
def test_ours_memory_sets_a_consistent_colocation(bench, memory, swaps, backup):
    from trainer.arguments import parse_args

    spec = full_spec(bench, work="/w", ours_memory=memory)
    args = parse_args(ours_system.ours_argv(spec, steps=1))
    assert args.placement.colocate
    assert args.placement.swaps_memory is swaps
    assert args.lora.lora_base_cpu_backup is backup


def test_ours_sglang_keeps_a_kv_cache_for_one_step_not_its_static_share(bench):
    """8 x 8 samples of 256 + 512 tokens, a quarter to spare: 61,440 tokens (6.6 GiB of K and V
    at the 0.6B shape, where 15% of an H200 is 21 GiB); `--ours-flags` may set another."""
    from trainer.arguments import parse_args

    spec = full_spec(bench, work="/w", ours_memory="keep")
    args = parse_args(ours_system.ours_argv(spec, steps=1))
    assert args.sglang.sglang_extra["max-total-tokens"] == "61440"
    assert args.sglang.sglang_mem_fraction_static == 0.15
    other = full_spec(bench, work="/w", ours_flags=["--sglang-max-total-tokens=1000"])
    assert parse_args(ours_system.ours_argv(other, steps=1)).sglang.sglang_extra == {
        **args.sglang.sglang_extra,
        "max-total-tokens": "1000",
    }


def test_ours_sglang_fraction_holds_a_step_s_kv_cache_on_the_device_at_hand(bench, tmp_path):
    """0.15 where that holds SGLang's weights, adapter slots and the capped KV cache; more where
    it does not (the 4B shape on an 80 GB GPU), up to 0.85."""
    from trainer.arguments import parse_args
    from trainer.backends import registry
    from trainer.job import memory_estimate, model_shape

    spec = tiny_spec(bench, tmp_path, device="cuda", rollout_backend="sglang")
    bench.prepare_inputs(spec, rows=8)
    config = parse_args(ours_system.ours_argv(spec, steps=1))
    targets = registry.adapter_targets(config).hf
    shape = model_shape.read(Path(spec.model_dir), lora_rank=64, lora_targets=targets)
    engine = memory_estimate.EngineSize(shape, dtype_bytes=2, adapter_slots=2)
    needed = engine.memory(ours_system.step_tokens(spec)) + memory_estimate.SGLANG_CAPTURE_RESERVE
    assert ours_system.engine_fraction(spec, config, free=100 * needed) == 0.15
    assert ours_system.engine_fraction(spec, config, free=4 * needed) == 0.25
    assert ours_system.engine_fraction(spec, config, free=needed) == 0.85


def test_an_8_bit_kv_cache_is_every_engine_s_same_format(bench, tmp_path):
    """``--kv-cache-dtype fp8``: ours' SGLang in fp8_e4m3, sized for half the bytes per token;
    Unsloth's vLLM with its float8_kv_cache; verl's vLLM engine with kv_cache_dtype fp8."""
    from trainer.arguments import parse_args
    from trainer.backends import registry
    from trainer.job import memory_estimate, model_shape

    # a step whose 16-bit KV cache is about SGLang's capture reserve, as the real shapes' are
    big = {"prompts": 64, "samples": 64, "response_len": 1024}
    spec = tiny_spec(bench, tmp_path, device="cuda", rollout_backend="sglang", **big)
    fp8 = tiny_spec(
        bench, tmp_path, device="cuda", rollout_backend="sglang", kv_cache_dtype="fp8", **big
    )
    bench.prepare_inputs(spec, rows=8)
    config = parse_args(ours_system.ours_argv(spec, steps=1))
    config_fp8 = parse_args(ours_system.ours_argv(fp8, steps=1))
    assert "kv-cache-dtype" not in config.sglang.sglang_extra
    assert config_fp8.sglang.sglang_extra["kv-cache-dtype"] == "fp8_e4m3"
    shape = model_shape.read(
        Path(spec.model_dir), lora_rank=64, lora_targets=registry.adapter_targets(config).hf
    )
    tokens = ours_system.step_tokens(spec)
    needed = {
        element: memory_estimate.EngineSize(
            shape, dtype_bytes=2, adapter_slots=2, kv_element_bytes=element
        ).memory(tokens)
        + memory_estimate.SGLANG_CAPTURE_RESERVE
        for element in (2.0, 1.0)
    }
    free = 4 * needed[2.0]
    assert ours_system.engine_fraction(spec, config, free) == 0.25
    fraction = ours_system.engine_fraction(fp8, config_fp8, free)
    assert fraction == math.ceil(100 * needed[1.0] / free) / 100 < 0.25
    assert not trl_system.unsloth_model_kwargs(spec)["float8_kv_cache"]
    assert trl_system.unsloth_model_kwargs(fp8)["float8_kv_cache"]
    rollout = "actor_rollout_ref.rollout"
    assert verl_system().config_changes(spec, steps=1)[f"{rollout}.engine_kwargs"] == {}
    assert verl_system().config_changes(fp8, steps=1)[f"{rollout}.engine_kwargs"] == {
        "vllm": {"kv_cache_dtype": "fp8"}
    }


def test_ours_config_takes_the_sized_fraction_unless_the_ours_flags_set_one(
    bench, tmp_path, capsys
):
    """At its most (0.85) the fraction is not said to hold a step's KV cache: at 8,192-token
    responses of the Qwen3-4B shape it held 427,191 tokens, where the step's samples reach
    540,672 (H100, 2026-12-06)."""
    spec = tiny_spec(bench, tmp_path, device="cuda", rollout_backend="sglang")
    bench.prepare_inputs(spec, rows=8)

    def full() -> DeviceMemory:  # one byte free: the most the fraction takes
        return DeviceMemory(free=1, total=1)

    capsys.readouterr()
    assert ours_system.ours_config(spec, 1, full).sglang.sglang_mem_fraction_static == 0.85
    said = capsys.readouterr().out
    assert "0.85, the most it is given" in said and "holds a step's KV cache" not in said
    for flags in (["--sglang-mem-fraction-static=0.3"], ["--sglang-mem-fraction-static", "0.3"]):
        chosen = tiny_spec(
            bench, tmp_path, device="cuda", rollout_backend="sglang", ours_flags=flags
        )
        assert ours_system.ours_config(chosen, 1, full).sglang.sglang_mem_fraction_static == 0.3


def test_ours_merged_with_memory_kept_is_a_config_whose_trainer_lends_its_base(bench, tmp_path):
    """`Ours` lends the trainer's base as train.py's placement does where `lends_base` holds:
    for the benchmark's argv merged and kept, or released without the base's host backup
    (`release-kv`), not swapped with it."""
    from trainer.arguments import parse_args
    from trainer.backends import shared_base

    def lends(memory: str) -> bool:
        spec = tiny_spec(
            bench, tmp_path, device="cuda", rollout_backend="sglang", ours_memory=memory,
            ours_flags=["--lora-serving", "merged"],
        )  # fmt: skip
        return shared_base.lends_base(parse_args(ours_system.ours_argv(spec, steps=1)), "cuda:0")

    assert lends("keep") and lends("release-kv")
    assert not lends("release")


def test_ours_memory_auto_leaves_the_choice_to_train_py(bench):
    from trainer.arguments import parse_args

    spec = full_spec(bench, work="/w", ours_memory="auto")
    args = parse_args(ours_system.ours_argv(spec, steps=1))
    assert args.placement.colocate and args.placement.colocate_memory == "auto"
    assert args.lora.lora_base_cpu_backup  # for when it releases


# ---------------------------------------------------------------------------- the seed's workload


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--systems", "verl"], "--systems verl: verl runs its own loop unpaced, so it needs"),
        (
            ["--device", "cpu", "--response-len", "8192"],
            "--prompt-len 256 + --response-len 8192 tokens: over the 4096 positions of the "
            "qwen3-0.6b shape",
        ),
    ],
)
def test_bad_workloads_exit_2_with_one_line(bench, capsys, argv, message):
    """verl's check comes before any CUDA check (this machine has no GPU)."""
    with pytest.raises(SystemExit) as exit_info:
        bench.parse(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("response_len", [4096, 8192])
def test_the_seeds_long_responses_reach_every_system(bench, response_len):
    """`--shape qwen3-4b --response-len N --gradient-checkpointing`: ours' argv (through
    train.py's parser) and TRL's config ask for N-token responses with activation recomputation,
    ours' KV cache holds the step's samples whole, and verl's config the same."""
    pytest.importorskip("trl")
    from trainer.arguments import parse_args

    argv = ["--device", "cpu", "--shape", "qwen3-4b", "--response-len", str(response_len)]
    _, spec = bench.parse([*argv, "--gradient-checkpointing", "--micro-batch", "2"])
    assert (spec.prompt_len, spec.response_len, spec.micro_batch) == (256, response_len, 2)
    spec.work, spec.device, spec.rollout_backend = "/w", "cuda", "sglang"
    args = parse_args(ours_system.ours_argv(spec, steps=3))
    assert args.rollout.rollout_max_response_len == response_len
    assert args.torch.gradient_checkpointing
    tokens = str(math.ceil(1.25 * 64 * (256 + response_len)))
    assert args.sglang.sglang_extra["max-total-tokens"] == tokens
    spec.device = "cpu"
    for kind in ("trl", "unsloth"):
        config = trl_system.trl_config(spec, steps=3, kind=kind)
        assert config.max_completion_length == response_len
        assert config.gradient_checkpointing is (kind == "trl")  # Unsloth's own instead
        assert config.per_device_train_batch_size * config.gradient_accumulation_steps == 64
    assert trl_system.unsloth_lora_kwargs(spec)["use_gradient_checkpointing"] == "unsloth"
    assert trl_system.unsloth_model_kwargs(spec)["max_seq_length"] == 256 + response_len
    changes = verl_system().config_changes(spec, steps=3)
    assert changes["data.max_response_length"] == response_len
    assert changes["actor_rollout_ref.model.enable_gradient_checkpointing"]
    assert changes["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] == 2


def test_the_long_response_bound_and_an_out_of_memory_system_are_reported(bench, tmp_path, capsys):
    """At Qwen3-4B's shape with 8,192-token responses the decode bound counts a KV cache of
    36 layers x 8 KV heads x 128 x K and V x 2 bytes per token, a mean context of 256 + 4,096
    tokens; a system that ran out of memory reads as not fitting, the others as measured."""
    spec = full_spec(bench, work=str(tmp_path), device="cpu", shape="qwen3-4b", response_len=8192)
    base, lora = decode_bound.count_params(spec)
    per_step = (2 * (base + lora) + 64 * (256 + 4096) * 147_456) / 4.8e12
    assert decode_bound.decode_bound(spec, 4.8, base, lora) == pytest.approx(64 / per_step)
    step = bench.StepTime(step_s=90.0, rollout_s=60.0, response_tokens=64 * 8192, total_tokens=0)
    measured = {
        "times": [bench.asdict(step)], "summary": bench.summary([step]), "peak": 2**30,
        "peak_own": 2**30, "allocated": 0, "reserved": None, "per_process": True, "versions": {},
    }  # fmt: skip
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 9.27 GiB"
    failed = {"failed": oom, "stage": "warm-up", "out_of_memory": bench.out_of_memory(oom)}
    bench.report(
        spec, {"ours": measured, "unsloth": failed}, 4.8, machine="CPU, 2 cores", alone=True
    )
    out = capsys.readouterr().out
    assert f"unsloth  does not fit (out of memory) at warm-up: {oom}" in out
    assert f"roofline ours: rollout 8738 tok/s vs HBM bound {64 / per_step:.0f} tok/s" in out
    assert "8192 response tokens" in out and "gradient checkpointing off" in out
    assert "KV cache in the model dtype" in out


def test_a_saved_run_is_reported_on_any_machine(bench, tmp_path, capsys):
    """``--report JSON``: the report of a run whose own was cut (verl's hang held J's command
    past the node's limit), with the document's device and workload: the decode bound at its
    device's bandwidth, the systems it left pending named; runs nothing."""
    spec = full_spec(bench, work=str(tmp_path), device="cuda")

    def measured(seconds):
        step = bench.StepTime(seconds, seconds / 2, response_tokens=64 * 512, total_tokens=0)
        return {
            "times": [bench.asdict(step)], "summary": bench.summary([step]), "peak": 2**30,
            "peak_own": 2**29, "allocated": 0, "reserved": None, "per_process": True,
            "versions": {},
        }  # fmt: skip

    document = {
        "spec": bench.asdict(spec), "machine": "NVIDIA H100 80GB HBM3, 16 cores",
        "one_at_a_time": True, "results": {"ours": measured(2.0), "unsloth": measured(3.0)},
        "ratios": {"unsloth": 1.5}, "pending": ["verl"],
    }  # fmt: skip
    saved = tmp_path / "e.json"
    saved.write_text(json.dumps(document))
    with pytest.raises(SystemExit) as exit_info:
        bench.parse(["--report", str(saved)])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1] == "NVIDIA H100 80GB HBM3, 16 cores"
    assert "systems: one at a time, each alone on the device" in out
    assert "ratio (unsloth median / ours median): 1.50x" in out
    assert "at 3.35 TB/s (NVIDIA H100 80GB HBM3)" in out
    assert out.splitlines()[-1] == "not run: verl (the same command with --resume runs them)"

    del document["machine"]
    saved.write_text(json.dumps(document))
    with pytest.raises(SystemExit) as exit_info:
        bench.parse(["--report", str(saved)])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert error[-1].endswith(f"--report: {saved} has no 'machine': not a --json of this version")


@pytest.mark.parametrize(
    ("details", "expected"),
    [
        ("Traceback ...\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate", True),
        ("ValueError: No available memory for the cache blocks. Try increasing", True),
        ("ray.exceptions.RayTaskError(OutOfMemoryError): ray::WorkerDict.update_actor()", True),
        ("ImportError: the trl of the extra path", False),
    ],
)
def test_out_of_memory_is_told_from_other_failures(bench, details, expected):
    assert bench.out_of_memory(details) is expected


# ---------------------------------------------------------------------------- Unsloth


def test_unsloth_loads_the_workload_unquantized_with_vllm_in_process(bench, tmp_path):
    spec = tiny_spec(bench, tmp_path)
    model = trl_system.unsloth_model_kwargs(spec)
    assert model["model_name"] == spec.model_dir and model["dtype"] == torch.bfloat16
    assert model["fast_inference"] and not model["load_in_4bit"]
    assert model["max_lora_rank"] == 64 and model["gpu_memory_utilization"] == 0.5
    assert (
        trl_system.unsloth_model_kwargs(tiny_spec(bench, tmp_path, vllm_memory=0.7))[
            "gpu_memory_utilization"
        ]
        == 0.7
    )
    lora = trl_system.unsloth_lora_kwargs(spec)
    assert (lora["r"], lora["lora_alpha"], lora["lora_dropout"]) == (64, 32, 0.0)
    assert lora["target_modules"] == workload.TARGETS
    assert lora["use_gradient_checkpointing"] is False


def test_unsloth_generates_with_its_own_vllm_and_trls_workload(bench, tmp_path):
    """Unsloth's GRPOConfig is TRL's (as Unsloth patches it): the trl-vllm generation, without
    TRL's sleep mode even side by side (Unsloth's engine shares the training weights)."""
    pytest.importorskip("trl")
    spec = tiny_spec(bench, tmp_path)
    config = trl_system.trl_config(spec, steps=3, kind="unsloth")
    eos = workload.build_tokenizer(spec, eos=True).eos_token_id
    assert vllm_settings(config) == (True, "colocate", False)
    assert config.generation_kwargs == {"min_tokens": 32, "stop_token_ids": [eos]}
    baseline = trl_system.trl_config(spec, steps=3, kind="trl")
    same = ("learning_rate", "per_device_train_batch_size", "gradient_accumulation_steps")
    same += ("steps_per_generation", "num_generations", "max_completion_length", "beta")
    assert {k: getattr(config, k) for k in same} == {k: getattr(baseline, k) for k in same}
    with_share = tiny_spec(bench, tmp_path, vllm_memory=0.6)
    vllm = trl_system.trl_config(with_share, steps=3, kind="trl-vllm")
    assert vllm.vllm_gpu_memory_utilization == 0.6


@pytest.mark.parametrize(
    ("kind", "modules"),
    [
        ("unsloth", {"unsloth", "unsloth_zoo", "vllm", "trl", "datasets"}),
        ("verl", {"verl", "ray", "hydra", "pandas", "vllm"}),
    ],
)
def test_the_peers_packages_are_named_with_their_targets(bench, kind, modules, tmp_path):
    spec = full_spec(bench)
    assert modules <= set(bench.needed_modules(spec, kind))
    for module in modules:
        (tmp_path / module).mkdir()
        (tmp_path / module / "__init__.py").write_text("")
    assert not [
        m
        for m in bench.missing_packages(spec, {kind: SystemPath([str(tmp_path)])})
        if m.split()[0] in modules
    ]
    named = {m.split()[0]: m for m in bench.missing_packages(spec, {kind: SystemPath()})}
    absent = {m for m in modules if importlib.util.find_spec(m) is None}  # here, without a path
    assert absent and {m: f"for {kind} (" in named.get(m, "") for m in absent} == dict.fromkeys(
        absent, True
    )


# ---------------------------------------------------------------------------- verl


def verl_system():
    import benchmarks.verl_system as module

    return module


def installed(folder, name, version):
    """`name` at `version` in `folder`, as pip --target leaves a distribution: its metadata and
    its package."""
    (folder / name).mkdir(parents=True, exist_ok=True)
    (folder / name / "__init__.py").write_text("")
    info = folder / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def test_verl_is_refused_in_one_line_with_a_peft_that_sends_it_no_adapter(bench, tmp_path, capsys):
    """peft 0.21 finds no adapter entries under verl's FSDP1 actor (verl_system.peft_problem):
    the run would start verl, fail in vLLM's add_lora and hang; it is refused before anything
    starts, naming the peft found first on verl's path. 0.20 passes."""
    site = tmp_path / "site-verl"
    for module in ("verl", "ray", "hydra", "pandas", "vllm", "psutil", "transformers", "pynvml"):
        (site / module).mkdir(parents=True)
        (site / module / "__init__.py").write_text("")
    installed(site, "peft", "0.21.0")
    argv = ["--systems", "verl", "--one-at-a-time", "--verl-path", str(site)]
    with pytest.raises(SystemExit) as exit_info:
        bench.parse(argv)
    assert exit_info.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"--systems verl: peft 0.21.0 ({site})" in line and "peft 0.20.0" in line

    older = tmp_path / "peft-0.20"
    installed(older, "peft", "0.20.0")
    assert verl_system().peft_problem([str(older), str(site)]) is None
    assert "peft 0.21.0" in verl_system().peft_problem([str(site), str(older)])


def test_verl_runs_the_workload_as_grpo_with_lora_on_one_gpu(bench, tmp_path):
    spec = full_spec(bench, work=str(tmp_path), response_len=4096)
    changes = verl_system().config_changes(spec, steps=5)
    model, actor = "actor_rollout_ref.model", "actor_rollout_ref.actor"
    rollout = "actor_rollout_ref.rollout"
    assert changes["algorithm.adv_estimator"] == "grpo"
    assert (changes["data.train_batch_size"], changes[f"{rollout}.n"]) == (8, 8)
    assert changes[f"{actor}.ppo_mini_batch_size"] == 8  # all 8 prompts: one update a step
    assert (changes[f"{actor}.ppo_epochs"], changes["trainer.total_training_steps"]) == (1, 5)
    assert (changes["data.max_prompt_length"], changes["data.max_response_length"]) == (256, 4096)
    assert changes[f"{rollout}.ignore_eos"] and changes[f"{rollout}.name"] == "vllm"
    assert (changes[f"{model}.lora_rank"], changes[f"{model}.lora_alpha"]) == (64, 32)
    assert changes[f"{model}.target_modules"] == "all-linear"
    assert changes[f"{actor}.optim.lr"] == 2e-5 and not changes[f"{actor}.use_kl_loss"]
    assert changes[f"{actor}.loss_agg_mode"] == "token-mean"
    assert changes[f"{rollout}.gpu_memory_utilization"] == 0.5
    other = full_spec(bench, work=str(tmp_path), vllm_memory=0.3)
    assert verl_system().config_changes(other, steps=5)[f"{rollout}.gpu_memory_utilization"] == 0.3
    assert changes["trainer.n_gpus_per_node"] == 1
    assert changes[f"{rollout}.tensor_model_parallel_size"] == 1
    reward = "reward.custom_reward_function"
    found = importlib.util.spec_from_file_location("verl_reward", changes[f"{reward}.path"])
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)  # as verl loads it: by path, in another process
    name = changes[f"{reward}.name"]
    texts = ["t7 t81", "t7 t812"]
    assert [getattr(module, name)("grpo_vs_trl", t, "", extra_info={}) for t in texts] == [
        parity(t) for t in texts
    ]


def test_verl_reads_the_prompts_as_the_others_tokenize_them(bench, tmp_path):
    """verl's data set holds each prompt as one chat message, and its chat template renders the
    message's text alone: the same tokens as the other systems' plain prompts."""
    pandas = pytest.importorskip("pandas")
    spec = tiny_spec(bench, tmp_path)
    path = tmp_path / "verl" / "prompts.parquet"
    verl_system().write_prompts(path, ["red blue", "green"])
    rows = pandas.read_parquet(path)
    assert [list(m) for m in rows["prompt"]] == [
        [{"role": "user", "content": "red blue"}],
        [{"role": "user", "content": "green"}],
    ]
    assert list(rows["data_source"]) == ["grpo_vs_trl"] * 2
    assert all(r["ground_truth"] == "" for r in rows["reward_model"])
    tokenizer = workload.build_tokenizer(spec, eos=False)
    tokenizer.chat_template = verl_system().CHAT_TEMPLATE
    messages = [{"role": "user", "content": "red blue"}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert list(ids) == tokenizer("red blue")["input_ids"]


def test_verls_config_has_every_key_the_benchmark_changes(bench, tmp_path):
    """Against the installed verl's own `ppo_trainer` config (skipped without verl)."""
    pytest.importorskip("hydra")
    try:
        verl_system().config_dir()
    except ModuleNotFoundError:
        pytest.skip("verl is not installed")
    from omegaconf import OmegaConf

    spec = full_spec(bench, work=str(tmp_path), kv_cache_dtype="fp8")
    config = verl_system().compose(spec, steps=3)
    assert OmegaConf.select(config, "actor_rollout_ref.rollout.response_length") == 512
    engine = OmegaConf.select(config, "actor_rollout_ref.rollout.engine_kwargs")
    assert engine.vllm == {"kv_cache_dtype": "fp8"} and "sglang" in engine  # merged, not replaced
    assert OmegaConf.select(config, "actor_rollout_ref.actor.rollout_n") == 8
    env = OmegaConf.select(config, "ray_kwargs.ray_init.runtime_env.env_vars")
    assert env == {"VERL_FILE_LOGGER_PATH": str(tmp_path / "verl" / "metrics.jsonl")}
    OmegaConf.to_container(config, resolve=True)


def test_verls_logged_steps_are_read_as_they_land(bench, tmp_path):
    """verl's file logger writes a JSON line per step; the worker reads each as it lands (a
    line written in two parts too), maps it to a step, and says when verl finished first."""
    import threading

    path = tmp_path / "metrics.jsonl"
    data = {
        "response_length/mean": 512.0, "timing_s/gen": 2.5, "timing_s/update_actor": 1.5,
        "timing_s/step": 4.5, "actor/perf/max_memory_allocated_gb": 30.0,
        "actor/perf/max_memory_reserved_gb": 32.0, "perf/max_memory_allocated_gb": 1.0,
    }  # fmt: skip
    line = json.dumps({"step": 1, "data": data}) + "\n"
    finished = threading.Event()

    def verl() -> None:
        time.sleep(0.1)
        with open(path, "a", encoding="utf-8") as f:
            f.write(line[:20])
            f.flush()
            time.sleep(0.1)
            f.write(line[20:] + json.dumps({"step": 2, "data": {**data, "timing_s/gen": 3.0}}))
            f.write("\n")
        finished.set()

    running = threading.Thread(target=verl)
    running.start()
    log = verl_system().StepLog(path)
    first, _ = log.next(finished)
    second, _ = log.next(finished)
    running.join()
    assert (first["step"], second["step"]) == (1, 2)
    assert log.next(finished) is None
    step = verl_system().step_time(first, 5.0, rows=64, prompt_len=256)
    assert step == {
        "step_s": 5.0, "rollout_s": 2.5, "response_tokens": 64 * 512,
        "total_tokens": 64 * (512 + 256), "phases": {"gen": 2.5, "update_actor": 1.5},
    }  # fmt: skip
    assert bench.StepTime(**step).rollout_s == 2.5
    assert verl_system().actor_peaks([first, second]) == (30 * 2**30, 32 * 2**30)
    unprefixed = {"step": 3, "data": {"perf/max_memory_allocated_gb": 1.0}}
    assert verl_system().actor_peaks([unprefixed]) == (None, None)  # n/a, not a false 0


def stand_in_verl(monkeypatch, run_ppo):
    """verl's modules as far as the verl worker calls them, with `run_ppo` standing in for its
    training (which needs a GPU and vLLM)."""
    from types import ModuleType

    calls = []
    names = {
        "verl": {},
        "verl.trainer": {},
        "verl.trainer.main_ppo": {"TaskRunnerV1": "TaskRunnerV1", "run_ppo": run_ppo},
        "verl.trainer.ppo": {},
        "verl.trainer.ppo.utils": {
            "need_critic": lambda config: False,
            "need_reference_policy": lambda config: False,
        },
        "verl.utils": {},
        "verl.utils.config": {"validate_config": lambda *args: calls.append(("validate", args))},
        "verl.utils.device": {"auto_set_device": lambda config: calls.append(("device",))},
    }
    for name, attributes in names.items():
        module = ModuleType(name)
        module.__dict__.update(attributes)
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(verl_system(), "compose", lambda spec, steps: {"steps": steps})
    return calls


def verl_logger(spec, steps, allocated_gb):
    """What verl's file logger writes over `steps` steps: one JSON line each."""

    def run_ppo(config, task_runner_class):
        assert config == {"steps": steps} and task_runner_class == "TaskRunnerV1"
        with open(verl_system().paths(spec.work)["log"], "a", encoding="utf-8") as f:
            for step in range(1, steps + 1):
                time.sleep(0.05)
                data = {
                    "response_length/mean": float(spec.response_len), "timing_s/gen": 0.03,
                    "timing_s/step": 0.05,
                    "actor/perf/max_memory_allocated_gb": allocated_gb[step - 1],
                    "actor/perf/max_memory_reserved_gb": allocated_gb[step - 1] + 1,
                }  # fmt: skip
                f.write(json.dumps({"step": step, "data": data}) + "\n")
                f.flush()

    return run_ppo


@pytest.mark.timeout(120)
def test_the_verl_worker_answers_each_step_with_the_step_verl_logged(bench, tmp_path, monkeypatch):
    """verl trains unpaced in a thread; the worker answers the parent's commands with its logged
    steps in order, and its peak allocation counts the timed steps only (after "reset")."""
    pytest.importorskip("pandas")
    spec = tiny_spec(bench, tmp_path)
    calls = stand_in_verl(monkeypatch, verl_logger(spec, 3, [50.0, 20.0, 30.0]))
    commands = Commands(["step", "reset", "step", "step"])
    memory = peak_memory.PeakMemory("cpu", 0)
    peaks = verl_system().run(spec, 3, commands, memory, {"verl": "0.9.1"}, ["a b", "c"])
    memory.stop()
    assert commands.sent[0] == ("ready", {"verl": "0.9.1"})
    steps = commands.sent[1:]
    assert [s["response_tokens"] for s in steps] == [64 * 32] * 3
    assert all(s["step_s"] >= 0.04 and s["phases"] == {"gen": 0.03} for s in steps)
    assert peaks == (30 * 2**30, 31 * 2**30)  # the warm-up step's 50 GiB is not a timed step's
    assert [c[0] for c in calls] == ["device", "validate"]
    assert memory.peak > 0  # sampled while verl ran


@pytest.mark.timeout(120)
def test_a_verl_failure_reaches_the_parent_as_the_workers_error(bench, tmp_path, monkeypatch):
    pytest.importorskip("pandas")
    spec = tiny_spec(bench, tmp_path)

    def run_ppo(config, task_runner_class):
        raise MemoryError("CUDA out of memory in the actor")

    stand_in_verl(monkeypatch, run_ppo)
    memory = peak_memory.PeakMemory("cpu", 0)
    with pytest.raises(MemoryError, match="CUDA out of memory in the actor"):
        verl_system().run(spec, 2, Commands(["step", "step"]), memory, {}, ["a"])
    memory.stop()


@pytest.mark.timeout(120)
def test_a_verl_run_that_ends_early_is_a_failure(bench, tmp_path, monkeypatch):
    pytest.importorskip("pandas")
    spec = tiny_spec(bench, tmp_path)
    logged_one = verl_logger(spec, 1, [10.0])  # verl asked for 2 steps, ending after 1

    def run_ppo(config, task_runner_class):
        logged_one({"steps": 1}, task_runner_class)

    stand_in_verl(monkeypatch, run_ppo)
    memory = peak_memory.PeakMemory("cpu", 0)
    commands = Commands(["step", "step"])
    with pytest.raises(RuntimeError, match="verl logged 1 of its 2 steps"):
        verl_system().run(spec, 2, commands, memory, {}, ["a"])
    memory.stop()
    assert len(commands.sent) == 2  # ready, then the one step verl logged


@pytest.mark.parametrize(
    ("name", "tbps"),
    [
        ("NVIDIA H100 80GB HBM3", 3.35),
        ("NVIDIA H100 PCIe", 2.0),
        ("NVIDIA H100 NVL", 3.9),
        ("NVIDIA H200", 4.8),
        ("AMD Instinct MI355X", 8.0),
        ("NVIDIA GeForce RTX 4090", None),
    ],
)
def test_the_decode_bound_takes_the_devices_own_bandwidth(bench, name, tbps):
    assert decode_bound.device_hbm_tbps(name) == tbps
    assert decode_bound.bound_bandwidth(None, name)[0] == tbps
    assert decode_bound.bound_bandwidth(9.6, name) == (9.6, "9.6 TB/s (--hbm-tbps)")
