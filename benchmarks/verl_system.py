"""`benchmarks/grpo_vs_trl.py`'s `verl` system: verl 0.9.1's GRPO with LoRA on one GPU.

verl runs as its users run it: `verl.trainer.main_ppo`'s default `ppo_trainer` config, composed
with Hydra and changed only where the benchmark's workload says (`config_changes`), then its
own `run_ppo` with the V1 task runner (a local Ray cluster; the synchronous V1 trainer, FSDP
actor with the LoRA adapter, vLLM in server mode in a Ray actor serving the adapter on the base
weights, colocated: vLLM sleeps while the actor trains). Changes from verl's defaults that are
not the workload: one GPU (`n_gpus_per_node` 1, vLLM tensor parallel 1); SDPA attention and no
remove-padding, since flash-attn has no wheel for the node (constraints/verl-0.9.1-vllm-0.24.0.txt);
a chat template that is the prompt's text itself (the word-level tokenizer has none; the other
systems tokenize the plain text); the file logger only; no validation, no checkpoints.

verl drives its own loop inside Ray, so the parent cannot pace its steps: it runs all of them
unpaced (hence `--one-at-a-time` only), and each step is read from verl's file logger as it
lands. A step's time is the wall time between two logged steps (the first: from the start, so
verl's start-up is in its first warm-up step); its phases are verl's own `timing_s/*`, its
rollout verl's `gen`, its response tokens verl's `response_length/mean` times the samples.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.tiny import parity

if TYPE_CHECKING:
    from benchmarks.peak_memory import PeakMemory
    from benchmarks.workload import Spec

# The prompt's text, nothing around it: the same tokens as the other systems' plain prompts.
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
# vLLM's share of the GPU where `--vllm-memory` is not given: verl's own default.
VERL_VLLM_MEMORY = 0.5
POLL_S = 0.02
# the actor's memory peaks as verl's V1 trainer logs them (its worker's metrics, renamed)
ACTOR_PEAK = "actor/perf/max_memory_"
# The first peft whose `get_peft_model_state_dict` finds the adapter's entries by module name:
# under verl 0.9.1's FSDP1 actor, whose module names carry `_fsdp_wrapped_module.`, it finds
# none, verl sends vLLM an empty adapter and vLLM's `add_lora` fails (StopIteration) while verl
# waits on. Its target carries peft 0.20.0 (constraints/verl-0.9.1-vllm-0.24.0.txt).
PEFT_WITHOUT_ADAPTER = (0, 21)


def reward(data_source: str, solution_str: str, ground_truth: str, **_: Any) -> float:
    """verl's `custom_reward_function`: the other systems' reward, the parity of the response
    text's length."""
    return parity(solution_str)


def peft_problem(path: list[str]) -> str | None:
    """Why the peft that verl's worker would import (the first on `path`, its whole search path)
    sends verl's rollout no adapter, or None (also where there is none: the missing-package
    check names it)."""
    from importlib.metadata import distributions

    from packaging.version import Version

    found = next(iter(distributions(name="peft", path=path)), None)
    if found is None:
        return None
    if Version(found.version).release[:2] < PEFT_WITHOUT_ADAPTER:
        return None
    return (
        f"peft {found.version} ({found.locate_file('')}) gives verl 0.9.1's FSDP actor no LoRA "
        "weights to send to vLLM: put peft 0.20.0 first on the path "
        "(constraints/verl-0.9.1-vllm-0.24.0.txt)"
    )


def paths(work: str) -> dict[str, Path]:
    root = Path(work) / "verl"
    return {
        "data": root / "prompts.parquet",
        "log": root / "metrics.jsonl",
        "checkpoints": root / "checkpoints",
    }


def config_changes(spec: Spec, steps: int) -> dict[str, Any]:
    """Dotted keys of verl's `ppo_trainer` config and their values for the benchmark's workload
    (`spec`) over `steps` steps, warm-up included."""
    where = paths(spec.work)
    vllm_memory = VERL_VLLM_MEMORY if spec.vllm_memory is None else spec.vllm_memory
    actor = "actor_rollout_ref.actor"
    rollout = "actor_rollout_ref.rollout"
    model = "actor_rollout_ref.model"
    kv_cache = {"vllm": {"kv_cache_dtype": "fp8"}} if spec.kv_cache_dtype == "fp8" else {}
    return {
        "algorithm.adv_estimator": "grpo",
        "algorithm.use_kl_in_reward": False,
        "data.train_files": str(where["data"]),
        "data.val_files": str(where["data"]),
        "data.train_batch_size": spec.prompts,
        "data.max_prompt_length": spec.prompt_len,
        "data.max_response_length": spec.response_len,
        "data.filter_overlong_prompts": False,
        "data.truncation": "error",
        "data.shuffle": False,
        "data.dataloader_num_workers": 0,
        f"{model}.path": spec.model_dir,
        f"{model}.custom_chat_template": CHAT_TEMPLATE,
        f"{model}.override_config": {"attn_implementation": "sdpa"},
        f"{model}.use_remove_padding": False,
        f"{model}.enable_gradient_checkpointing": spec.gradient_checkpointing,
        f"{model}.lora_rank": 64,
        f"{model}.lora_alpha": 32,
        f"{model}.target_modules": "all-linear",
        f"{actor}.optim.lr": spec.lr,
        f"{actor}.optim.weight_decay": 0.0,
        f"{actor}.ppo_mini_batch_size": spec.prompts,  # one optimizer update per step
        f"{actor}.ppo_micro_batch_size_per_gpu": spec.micro_batch,
        f"{actor}.ppo_epochs": 1,
        f"{actor}.use_dynamic_bsz": False,
        f"{actor}.use_kl_loss": False,
        f"{actor}.entropy_coeff": 0,
        f"{actor}.loss_agg_mode": "token-mean",
        f"{rollout}.name": "vllm",
        f"{rollout}.n": spec.samples,
        f"{rollout}.tensor_model_parallel_size": 1,
        f"{rollout}.gpu_memory_utilization": vllm_memory,
        f"{rollout}.engine_kwargs": kv_cache,  # merged into verl's: vLLM's engine arguments
        f"{rollout}.ignore_eos": True,  # every response as long as asked
        f"{rollout}.temperature": 1.0,
        f"{rollout}.log_prob_micro_batch_size_per_gpu": spec.micro_batch,
        "reward.custom_reward_function.path": str(Path(__file__).resolve()),
        "reward.custom_reward_function.name": "reward",
        "trainer.n_gpus_per_node": 1,
        "trainer.nnodes": 1,
        "trainer.logger": ["file"],
        "trainer.val_before_train": False,
        "trainer.test_freq": -1,
        "trainer.save_freq": -1,
        "trainer.resume_mode": "disable",
        "trainer.total_training_steps": steps,
        "trainer.total_epochs": 1,
        "trainer.default_local_dir": str(where["checkpoints"]),
        "trainer.project_name": "grpo_vs_trl",
        "trainer.experiment_name": "verl",
        "trainer.device": "cuda",
    }


def config_dir() -> Path:
    """verl's trainer configs, found without importing verl (its import needs torch and Ray)."""
    found = find_spec("verl")
    if found is None or not found.submodule_search_locations:
        raise ModuleNotFoundError("verl is not installed (its target: --verl-path)")
    return Path(found.submodule_search_locations[0]) / "trainer" / "config"


def compose(spec: Spec, steps: int) -> Any:
    """verl's default `ppo_trainer` config (Hydra, from the installed verl) with
    `config_changes` applied (a key verl does not have raises: the config is a struct), and
    the file logger's path in the environment of Ray's processes (where verl logs)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import DictConfig, OmegaConf, open_dict

    with initialize_config_dir(config_dir=str(config_dir()), version_base=None):
        config = hydra_compose(config_name="ppo_trainer")
    for key, value in config_changes(spec, steps).items():
        parent, _, name = key.rpartition(".")
        node = OmegaConf.select(config, parent)
        if not isinstance(node, DictConfig) or name not in list(node):  # `???` ones count
            raise KeyError(f"verl's ppo_trainer config has no {key}")
        with open_dict(config):  # a dict's new keys, as Hydra's `+key=value` adds them
            OmegaConf.update(config, key, value, merge=isinstance(value, dict))
    runtime_env = config.ray_kwargs.ray_init.runtime_env
    with open_dict(runtime_env):
        runtime_env.env_vars = {"VERL_FILE_LOGGER_PATH": str(paths(spec.work)["log"])}
    return config


def write_prompts(path: Path, prompts: list[str]) -> None:
    """verl's RL data set: one chat message per prompt, a data source and a ground truth."""
    import pandas

    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [
        {
            "data_source": "grpo_vs_trl",
            "prompt": [{"role": "user", "content": text}],
            "reward_model": {"style": "rule", "ground_truth": ""},
            "extra_info": {"index": index},
        }
        for index, text in enumerate(prompts)
    ]
    pandas.DataFrame(rows).to_parquet(path)


def step_time(record: dict[str, Any], step_s: float, rows: int, prompt_len: int) -> dict[str, Any]:
    """A StepTime (as a dict) from one step of verl's file logger (`{"step", "data"}`)."""
    data = record["data"]
    responses = round(data["response_length/mean"] * rows)
    return {
        "step_s": step_s,
        "rollout_s": data["timing_s/gen"],
        "response_tokens": responses,
        "total_tokens": responses + rows * prompt_len,
        "phases": {
            key.removeprefix("timing_s/"): value
            for key, value in data.items()
            if key.startswith("timing_s/") and key != "timing_s/step"
        },
    }


def actor_peaks(records: list[dict[str, Any]]) -> tuple[int | None, int | None]:
    """The actor's peak torch allocation and reservation over `records`, in bytes: its
    ``perf/max_memory_{allocated,reserved}_gb``, which the V1 trainer logs under ``actor/``;
    None where no record has it (the report says n/a, not 0)."""

    def peak(key: str) -> int | None:
        found = [r["data"][key] for r in records if key in r["data"]]
        return round(max(found) * 2**30) if found else None

    return peak(f"{ACTOR_PEAK}allocated_gb"), peak(f"{ACTOR_PEAK}reserved_gb")


class StepLog:
    """verl's file logger, read as it grows: `next` waits for the next logged step."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.pending = b""

    def next(self, finished: threading.Event) -> tuple[dict[str, Any], float] | None:
        """The next step's record and the time it landed; None where verl finished first."""
        while True:
            done = finished.is_set()  # before reading: a step logged just before it still counts
            record = self._read()
            if record is not None:
                return record, time.perf_counter()
            if done:
                return None
            time.sleep(POLL_S)

    def _read(self) -> dict[str, Any] | None:
        if not self.path.exists():
            return None
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            self.pending += f.read()
            self.offset = f.tell()
        line, newline, rest = self.pending.partition(b"\n")
        if not newline:
            return None
        self.pending = rest
        return json.loads(line)


def run(
    spec: Spec,
    steps: int,
    conn: Any,
    memory: PeakMemory,
    versions: dict[str, str],
    prompts: list[str],
) -> tuple[int | None, int | None]:
    """The verl worker: verl trains `steps` steps on its own, in this process's main thread (Ray
    sets its signal handlers there); a thread answers every "step" command from the parent with
    the next step verl logged. Returns the actor's peak torch allocation and reservation over
    the timed steps."""
    import ray
    from verl.trainer.main_ppo import TaskRunnerV1, run_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    where = paths(spec.work)
    write_prompts(where["data"], prompts)
    config = compose(spec, steps)
    auto_set_device(config)
    validate_config(config, need_reference_policy(config), need_critic(config))
    log = StepLog(where["log"])
    rows = spec.prompts * spec.samples
    records: list[dict[str, Any]] = []  # since the timed steps began
    answered: list[int] = []
    finished = threading.Event()

    def answer() -> None:
        last = time.perf_counter()  # the first step's time holds verl's start-up
        for index in range(steps):
            command = conn.recv()
            if command == "reset":  # the timed steps begin: the peak and the actor's peak
                memory.reset()
                records.clear()
                command = conn.recv()
            memory.watch()  # never paused: verl does not wait between steps
            found = log.next(finished)
            if found is None:  # verl ended early: the main thread says why
                return
            record, landed = found
            records.append(record)
            conn.send(step_time(record, landed - last, rows, spec.prompt_len))
            answered.append(index)
            last = landed

    conn.send(("ready", versions))
    answering = threading.Thread(target=answer, daemon=True)
    answering.start()
    try:
        run_ppo(config, task_runner_class=TaskRunnerV1)
    finally:
        finished.set()
        ray.shutdown()
    answering.join()
    if len(answered) < steps:
        raise RuntimeError(f"verl logged {len(answered)} of its {steps} steps")
    memory.pause()
    return actor_peaks(records)
