"""Rewards on realistic model outputs, malformed ones included."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from trainer.grpo import grading, rewards
from trainer.grpo.rewards import get_reward, register_reward, reward_names

CASES = [
    json.loads(line)
    for line in (Path(__file__).parents[2] / "data" / "reward_cases.jsonl").read_text().splitlines()
]


def test_the_table_is_large_and_covers_both_grades() -> None:
    assert len(CASES) >= 100
    for rm_type in ("deepscaler", "math"):
        assert {case[rm_type] for case in CASES} == {0, 1}


@pytest.mark.parametrize("case", CASES, ids=[f"{i + 1}:{c['note']}" for i, c in enumerate(CASES)])
@pytest.mark.parametrize("rm_type", ["deepscaler", "math"])
def test_rewards_grade_as_miles_rm_hub(rm_type: str, case: dict) -> None:
    """Expected grades were derived by reading miles' rm_hub grader (see the table's notes)."""
    assert get_reward(rm_type)(case["response"], case["label"]) == case[rm_type]


@pytest.mark.parametrize(
    "answer",
    ['__import__("os").system("true")', "9^9^9", "9**9**9", "9^{9^9}", "E.evalf()", "x y z w"],
)
def test_unsafe_or_costly_answers_never_reach_sympy(answer: str) -> None:
    assert grading.equal_sympy(answer, "1") is False


def test_deliberate_differences_from_miles() -> None:
    # a list label is a set of acceptable answers (miles asserts a single label)
    assert get_reward("deepscaler")("</think>\\boxed{3}", ["2", "3"]) == 1.0
    assert get_reward("math")("\\boxed{3}", ["2", "3"]) == 1.0
    # an answer that normalises to infinity: miles raises, here it is graded 0
    assert get_reward("math")("\\boxed{\\infty}", "5") == 0.0


def test_extraction() -> None:
    assert grading.last_boxed("a \\boxed{\\frac{1}{\\sqrt{2}}} b") == "\\frac{1}{\\sqrt{2}}"
    assert grading.last_boxed("\\boxed{1} and \\boxed{{2}}") == "{2}"
    assert grading.last_boxed("nothing") is None
    assert grading.last_boxed("\\boxed 5 {x}") is None


@pytest.mark.parametrize(
    ("name", "response", "label", "reward"),
    [
        ("exact_match", " abc \n", "abc", 1.0),
        ("exact_match", "<think>hm</think> abc", "abc", 1.0),
        ("exact_match", "<think>abc", "abc", 0.0),
        ("exact_match", "abcd", "abc", 0.0),
        ("exact_match", "7", 7, 1.0),
        ("prefix_match", " abc and more", "abc", 1.0),
        ("prefix_match", "xabc", "abc", 0.0),
        ("prefix_match", "anything", "", 0.0),
    ],
)
def test_synthetic_rewards(name: str, response: str, label: object, reward: float) -> None:
    assert get_reward(name)(response, label) == reward


def test_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rewards, "_REGISTRY", dict(rewards._REGISTRY))
    assert {"deepscaler", "math", "exact_match", "prefix_match", "tiny"} <= set(reward_names())

    @register_reward("always_one")
    def always_one(response: str, label: object) -> float:
        return 1.0

    assert get_reward("always_one") is always_one and "always_one" in reward_names()
    with pytest.raises(ValueError, match="already registered"):
        register_reward("always_one")(lambda response, label: 0.0)
    with pytest.raises(ValueError, match="unknown reward 'nope'; known: always_one, deepscaler"):
        get_reward("nope")


def test_lazy_entries_import_their_module(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(rewards, "_REGISTRY", dict(rewards._REGISTRY))
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "lazy_by_name.py").write_text("def score(response, label):\n    return 0.5\n")
    (tmp_path / "lazy_by_register.py").write_text(
        "from trainer.grpo.rewards import register_reward\n"
        "@register_reward('registering')\n"
        "def other_name(response, label):\n    return 0.25\n"
    )
    monkeypatch.setitem(rewards._LAZY, "by_name", "lazy_by_name:score")
    monkeypatch.setitem(rewards._LAZY, "registering", "lazy_by_register:missing")
    assert "lazy_by_name" not in sys.modules
    assert get_reward("by_name")("x", "y") == 0.5
    assert get_reward("registering")("x", "y") == 0.25


async def async_length_reward(args, sample) -> dict:
    """A miles-style custom reward: async, (args, sample), a dict under --reward-key."""
    return {"score": len(sample.response) / 10, "other": -1.0}


def test_custom_reward_functions_use_miles_signature() -> None:
    function = rewards.load_function("tests.trainer.grpo.test_rewards.async_length_reward")
    samples = [rewards.RewardSample(prompt="p", response=r, label="x") for r in ("abcd", "ab")]
    value, short = rewards.call_custom_rewards(function, None, samples)
    assert value == {"score": 0.4, "other": -1.0} and short["score"] == pytest.approx(0.2)
    assert rewards.reward_value(value, "score") == pytest.approx(0.4)
    assert rewards.reward_value(1, None) == 1.0
    with pytest.raises(ValueError, match=r"the reward is a dict \(keys: other, score\)"):
        rewards.reward_value(value, None)
    with pytest.raises(ValueError, match=r"cannot import tests\.trainer\.grpo\.test_rewards\.nope"):
        rewards.load_function("tests.trainer.grpo.test_rewards.nope")


def test_nonzero_std_filter_keeps_groups_whose_rewards_differ() -> None:
    from trainer.grpo.filters import check_reward_nonzero_std, keeps

    def group(*values: float) -> list:
        return [rewards.RewardSample("p", "r", "l", reward=v) for v in values]

    assert check_reward_nonzero_std(None, group(1.0, 0.0, 1.0)) is True
    assert check_reward_nonzero_std(None, group(1.0, 1.0, 1.0)) is False
    assert keeps(True) and not keeps(type("Out", (), {"keep": False})())
