"""Adapter names and layouts between Megatron(-Bridge) LoRA and HF PEFT, checked with real PEFT."""

from __future__ import annotations

import sys

import pytest
import torch

from trainer.backends.megatron import lora_names as names
from trainer.backends.megatron.lora_names import AttentionShape, LoraNameError

GQA = AttentionShape(num_attention_heads=4, num_query_groups=2, head_dim=3)
RANK = 2


def _megatron_adapter(layers: int, hidden: int, ffn: int, attention: AttentionShape) -> dict:
    gen = torch.Generator().manual_seed(0)
    q_rows = attention.num_attention_heads * attention.head_dim
    out = {}
    for layer in range(layers):
        shapes = {
            "linear_qkv": ((RANK, hidden), (attention.qkv_rows, RANK)),
            "linear_proj": ((RANK, q_rows), (hidden, RANK)),
            "linear_fc1": ((RANK, hidden), (2 * ffn, RANK)),
            "linear_fc2": ((RANK, ffn), (hidden, RANK)),
        }
        for module, (a_shape, b_shape) in shapes.items():
            key_a = f"module.module.{names.megatron_key(layer, module, 'linear_in')}"
            out[key_a] = torch.randn(a_shape, generator=gen)
            out[names.megatron_key(layer, module, "linear_out")] = torch.randn(
                b_shape, generator=gen
            )
    return out


def test_split_qkv_follows_megatron_interleaved_gqa_layout() -> None:
    # Row r of the fused tensor is tagged with its (group, slot) so the split is readable.
    size, hpg = GQA.head_dim, GQA.heads_per_group
    fused = torch.tensor(
        [
            [g * 100 + slot * 10 + i]
            for g in range(2)
            for slot in range(hpg + 2)
            for i in range(size)
        ],
        dtype=torch.float32,
    )
    q, k, v = names.split_qkv_lora_b(fused, GQA)
    assert q.flatten().tolist() == [0, 1, 2, 10, 11, 12, 100, 101, 102, 110, 111, 112]
    assert k.flatten().tolist() == [20, 21, 22, 120, 121, 122]
    assert v.flatten().tolist() == [30, 31, 32, 130, 131, 132]
    assert torch.equal(names.merge_qkv_lora_b(q, k, v, GQA), fused)


def test_split_qkv_rejects_wrong_row_count() -> None:
    with pytest.raises(LoraNameError, match="expected 24"):
        names.split_qkv_lora_b(torch.zeros(20, RANK), GQA)


def test_round_trip_megatron_peft_megatron() -> None:
    state = _megatron_adapter(layers=2, hidden=8, ffn=10, attention=GQA)
    peft_state = names.megatron_to_peft(state, GQA)
    assert len(peft_state) == 2 * 7 * 2
    back = names.peft_to_megatron(peft_state, GQA)
    assert set(back) == {names.strip_wrappers(k) for k in state}
    for key, tensor in state.items():
        assert torch.equal(back[names.strip_wrappers(key)], tensor)


def test_layer_offset_gives_global_layer_numbers() -> None:
    state = _megatron_adapter(layers=1, hidden=8, ffn=10, attention=GQA)
    peft_state = names.megatron_to_peft(state, GQA, layer_offset=5)
    assert {names.parse_peft_key(k)[0] for k in peft_state} == {5}


def test_peft_to_megatron_rejects_independent_lora_a() -> None:
    peft_state = names.megatron_to_peft(_megatron_adapter(1, 8, 10, GQA), GQA)
    peft_state[names.peft_key(0, "k_proj", "A")] = torch.ones(RANK, 8)
    with pytest.raises(LoraNameError, match="shares one lora_A"):
        names.peft_to_megatron(peft_state, GQA)


def test_peft_to_megatron_names_missing_members() -> None:
    peft_state = names.megatron_to_peft(_megatron_adapter(1, 8, 10, GQA), GQA)
    del peft_state[names.peft_key(0, "up_proj", "B")]
    with pytest.raises(LoraNameError, match=r"up_proj\.lora_B"):
        names.peft_to_megatron(peft_state, GQA)


def test_unknown_names_are_rejected() -> None:
    with pytest.raises(LoraNameError, match="not a supported Megatron"):
        names.megatron_to_peft({"decoder.final_layernorm.weight": torch.zeros(1)}, GQA)
    with pytest.raises(LoraNameError, match="not a supported PEFT"):
        names.parse_peft_key("base_model.model.lm_head.lora_A.weight")


def test_bridge_style_names_without_prefix_parse() -> None:
    assert names.parse_peft_key("model.layers.3.mlp.down_proj.lora_B.weight") == (
        3,
        "down_proj",
        "B",
    )


@pytest.mark.parametrize(
    ("module", "which", "shard_shape"),
    [
        ("linear_qkv", "linear_in", (1, 8)),
        ("linear_qkv", "linear_out", (12, 2)),
        ("linear_proj", "linear_in", (2, 6)),
        ("linear_proj", "linear_out", (4, 2)),
        ("linear_fc1", "linear_in", (1, 8)),
        ("linear_fc1", "linear_out", (10, 2)),
        ("linear_fc2", "linear_in", (2, 5)),
        ("linear_fc2", "linear_out", (4, 2)),
    ],
)
def test_tp_gather_and_shard_are_inverse(module: str, which: str, shard_shape: tuple) -> None:
    shards = [torch.randn(shard_shape) for _ in range(2)]
    full = names.gather_tp_shards(module, which, shards)
    for rank in range(2):
        assert torch.equal(names.shard_for_tp(module, which, full, 2, rank), shards[rank])


def test_tp_gather_deinterleaves_fc1_gate_up() -> None:
    # Rank r holds [gate_r; up_r]; the TP=1 layout is [gate_0; gate_1; up_0; up_1].
    shards = [torch.tensor([[1.0], [2.0]]), torch.tensor([[3.0], [4.0]])]
    full = names.gather_tp_shards("linear_fc1", "linear_out", shards)
    assert full.flatten().tolist() == [1.0, 3.0, 2.0, 4.0]


def test_tp_shard_rejects_indivisible() -> None:
    with pytest.raises(LoraNameError, match="not divisible by TP 4"):
        names.shard_for_tp("linear_qkv", "linear_in", torch.zeros(2, 8), 4, 0)


def test_all_linear_expands_to_every_module() -> None:
    targets = names.resolve_targets("all-linear")
    assert targets.megatron == ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")
    assert targets.hf == names.HF_MODULES
    assert targets.widened == ()


def test_partial_fused_target_widens_and_says_so() -> None:
    targets = names.resolve_targets("q_proj, v_proj,down_proj")
    assert targets.megatron == ("linear_qkv", "linear_fc2")
    assert targets.widened == ("k_proj",)


def test_megatron_names_and_exclusions() -> None:
    targets = names.resolve_targets(["all-linear"], "linear_fc1,o_proj")
    assert targets.megatron == ("linear_qkv", "linear_fc2")
    assert targets.hf == ("q_proj", "k_proj", "v_proj", "down_proj")


def test_excluding_part_of_a_fused_group_is_an_error() -> None:
    with pytest.raises(LoraNameError, match="cannot exclude k_proj alone"):
        names.resolve_targets("all-linear", "k_proj")
    whole_group = names.resolve_targets("all-linear", "up_proj,gate_proj")
    assert whole_group.megatron == ("linear_qkv", "linear_proj", "linear_fc2")


@pytest.mark.parametrize(
    ("targets", "exclude", "message"),
    [
        ("q_prj", None, "did you mean q_proj"),
        ("", None, "no LoRA target modules"),
        ("o_proj", "o_proj", "every LoRA target module is excluded"),
        ("all-linear", "lm_head", "unknown LoRA exclude module 'lm_head'"),
    ],
)
def test_bad_target_lists(targets: str, exclude: str | None, message: str) -> None:
    with pytest.raises(LoraNameError, match=message):
        names.resolve_targets(targets, exclude)


def test_exported_adapter_loads_into_peft_and_matches_fused_delta(tmp_path) -> None:
    """The names are exactly PEFT's for a Qwen3 model, and the merged weights equal the fused
    Megatron adapter's delta, row for row."""
    import json

    import transformers
    from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict
    from safetensors.torch import save_file

    config = transformers.Qwen3Config(
        vocab_size=32,
        hidden_size=8,
        intermediate_size=10,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=3,
        max_position_embeddings=16,
    )
    attention = AttentionShape.from_hf_config(config)
    assert attention == GQA
    torch.manual_seed(0)
    base = transformers.Qwen3ForCausalLM(config)
    base.save_pretrained(tmp_path / "base")

    targets = names.resolve_targets("all-linear")
    reference = get_peft_model(
        transformers.Qwen3ForCausalLM(config),
        LoraConfig(r=RANK, lora_alpha=4, target_modules=list(targets.hf)),
    )
    megatron_state = _megatron_adapter(layers=2, hidden=8, ffn=10, attention=attention)
    exported = names.megatron_to_peft(megatron_state, attention)
    assert set(exported) == set(get_peft_model_state_dict(reference))

    adapter_dir = tmp_path / "adapter"
    adapter_dir.mkdir()
    save_file(
        {k: v.contiguous() for k, v in exported.items()}, adapter_dir / "adapter_model.safetensors"
    )
    config_dict = names.peft_config(
        targets, rank=RANK, alpha=4, dropout=0.0, base_model=str(tmp_path / "base")
    )
    (adapter_dir / "adapter_config.json").write_text(json.dumps(config_dict))
    # The portable engine builds its LoraConfig from the adapter's config dict this way.
    assert LoraConfig.from_peft_type(**config_dict).r == RANK

    merged = PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()
    base = transformers.Qwen3ForCausalLM.from_pretrained(tmp_path / "base")
    scale = 4 / RANK
    fused_delta = scale * (
        megatron_state[names.megatron_key(1, "linear_qkv", "linear_out")]
        @ megatron_state[f"module.module.{names.megatron_key(1, 'linear_qkv', 'linear_in')}"]
    )
    per_group = fused_delta.reshape(2, GQA.heads_per_group + 2, GQA.head_dim, 8)
    layer = 1
    for proj, rows in (
        ("q_proj", per_group[:, :2]),
        ("k_proj", per_group[:, 2]),
        ("v_proj", per_group[:, 3]),
    ):
        got = (
            getattr(merged.model.layers[layer].self_attn, proj).weight
            - getattr(base.model.layers[layer].self_attn, proj).weight
        )
        torch.testing.assert_close(got, rows.reshape(-1, 8), rtol=1e-5, atol=1e-6)
    fc1_delta = scale * (
        megatron_state[names.megatron_key(1, "linear_fc1", "linear_out")]
        @ megatron_state[f"module.module.{names.megatron_key(1, 'linear_fc1', 'linear_in')}"]
    )
    for proj, rows in zip(("gate_proj", "up_proj"), fc1_delta.chunk(2), strict=True):
        got = (
            getattr(merged.model.layers[layer].mlp, proj).weight
            - getattr(base.model.layers[layer].mlp, proj).weight
        )
        torch.testing.assert_close(got, rows, rtol=1e-5, atol=1e-6)


def test_heavy_packages_not_imported() -> None:
    assert not any(m == "sglang" or m.startswith(("sglang.", "megatron")) for m in sys.modules)
