"""Rewards on realistic model outputs, malformed ones included."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from trainer import rewards
from trainer.rewards import (
    extract_math_answer,
    get_reward,
    last_boxed,
    math_equal,
    register_reward,
    reward_names,
)

QWEN = (
    "<think>\nOkay, let me see. We need the sum 17 + 25. 17 + 25 = 42. Let me double check: "
    "20 + 22 = 42. Yes.\n</think>\n\nThe sum is $17 + 25 = 42$.\n\n**Final Answer**\n"
    "\\[\n\\boxed{42}\n\\]"
)

# (model output, label, reward): string/numeric normalisation only, sympy not needed
TABLE = [
    (QWEN, "42", 1.0),
    (QWEN, "43", 0.0),
    # thinking: only the text after </think> counts; an unclosed <think> scores 0
    ("<think>first guess \\boxed{41}</think>So \\boxed{42}.", "42", 1.0),
    ("<think>the answer is \\boxed{42}</think>I am not sure.", "42", 0.0),
    ("<think>\nlong reasoning ... \\boxed{42}", "42", 0.0),
    ("...so it is 42.\n</think>\n\n\\boxed{42}", "42", 1.0),  # template opened the block
    ("No thinking here. \\boxed{42}", "42", 1.0),
    # extraction: last box wins, nested braces, \fbox, "\boxed 5", malformed
    ("First \\boxed{3}, corrected: \\boxed{4}", "4", 1.0),
    ("First \\boxed{4}, corrected: \\boxed{3}", "4", 0.0),
    ("$\\boxed{\\frac{\\sqrt{3}}{2}}$", "\\frac{\\sqrt3}{2}", 1.0),
    ("\\fbox{12}", "12", 1.0),
    ("so $\\boxed 7$.", "7", 1.0),
    ("The answer is \\boxed{4", "4", 0.0),  # unbalanced (truncated) box
    ("The answer is 4.", "4", 0.0),  # no box
    ("\\boxed{}", "4", 0.0),
    ("", "4", 0.0),
    ("</think>", "4", 0.0),
    # numbers: integers, decimals, fractions, mixed numbers, thousands separators, signs
    ("\\boxed{4.0}", "4", 1.0),
    ("\\boxed{5.}", "5", 1.0),
    ("\\boxed{.5}", "\\frac12", 1.0),
    ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("\\boxed{\\dfrac{3}{4}}", "\\frac34", 1.0),
    ("\\boxed{\\tfrac{3}{4}}", "0.75", 1.0),
    ("\\boxed{3/4}", "\\frac{3}{4}", 1.0),
    ("\\boxed{-\\frac{1}{2}}", "-0.5", 1.0),
    ("\\boxed{\\frac{-1}{2}}", "-\\frac{1}{2}", 1.0),
    ("\\boxed{2\\frac{1}{2}}", "2.5", 1.0),
    ("\\boxed{0.333}", "\\frac13", 0.0),
    ("\\boxed{1,000,000}", "1000000", 1.0),
    ("\\boxed{1{,}000}", "1000", 1.0),
    ("\\boxed{-7}", "7", 0.0),
    # units, degrees, percent, dollars, text, \left \right, spacing, "x ="
    ("\\boxed{10\\%}", "10", 1.0),
    ("\\boxed{90^\\circ}", "90", 1.0),
    ("\\boxed{90^{\\circ}}", "90", 1.0),
    ("\\boxed{\\$5}", "5", 1.0),
    ("\\boxed{5 \\text{ cm}}", "5", 1.0),
    ("\\boxed{12 inches}", "12", 1.0),
    ("\\boxed{\\text{(C)}}", "C", 1.0),
    ("\\boxed{x = 3}", "3", 1.0),
    ("\\boxed{\\left( 1, 2 \\right)}", "(1,2)", 1.0),
    ("\\boxed{(1, 2.0)}", "(1,2)", 1.0),
    ("\\boxed{3, 5}", "5, 3", 0.0),
    ("\\boxed{\\{1,2\\}}", "\\{1,2\\}", 1.0),
    ("\\boxed{\\pi}", "\\pi", 1.0),
    # labels: boxed labels, numbers, lists of acceptable answers
    ("\\boxed{42}", 42, 1.0),
    ("\\boxed{42}", "\\boxed{42}", 1.0),
    ("\\boxed{0.5}", ["\\frac{1}{2}", "1/2"], 1.0),
]


@pytest.mark.parametrize(("response", "label", "reward"), TABLE)
def test_math_reward(response: str, label: object, reward: float) -> None:
    assert get_reward("math")(response, label) == reward
    assert get_reward("deepscaler")(response, label) == reward


SYMBOLIC = [
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}"),
    ("\\boxed{x^2+2x+1}", "(x+1)^2"),
    ("\\boxed{2\\pi}", "\\pi \\cdot 2"),
]


@pytest.mark.parametrize(("response", "label"), SYMBOLIC)
def test_symbolic_equivalence_with_sympy(response: str, label: str) -> None:
    pytest.importorskip("sympy")
    assert get_reward("math")(response, label) == 1.0


@pytest.mark.parametrize(("response", "label"), SYMBOLIC)
def test_without_sympy_only_normalised_forms_match(
    monkeypatch: pytest.MonkeyPatch, response: str, label: str
) -> None:
    monkeypatch.setitem(sys.modules, "sympy", None)  # import sympy now raises ImportError
    assert get_reward("math")(response, label) == 0.0
    assert get_reward("math")("\\boxed{\\dfrac{1}{2}}", "0.5") == 1.0


@pytest.mark.parametrize(
    "answer",
    ['__import__("os").system("true")', "9^9^9", "9^{9^9}", "E.evalf()", "x y z w"],
)
def test_unsafe_or_costly_answers_never_reach_sympy(answer: str) -> None:
    assert math_equal(answer, "1") is False


def test_extraction_helpers() -> None:
    assert last_boxed("a \\boxed{\\frac{1}{\\sqrt{2}}} b") == "\\frac{1}{\\sqrt{2}}"
    assert last_boxed("\\boxed{1} and \\boxed{{2}}") == "{2}"
    assert last_boxed("nothing") is None
    assert extract_math_answer("<think>x</think>\\boxed{1}") == "1"
    assert extract_math_answer("<think>\\boxed{1}") is None


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
        "from trainer.rewards import register_reward\n"
        "@register_reward('registering')\n"
        "def other_name(response, label):\n    return 0.25\n"
    )
    monkeypatch.setitem(rewards._LAZY, "by_name", "lazy_by_name:score")
    monkeypatch.setitem(rewards._LAZY, "registering", "lazy_by_register:missing")
    assert "lazy_by_name" not in sys.modules
    assert get_reward("by_name")("x", "y") == 0.5
    assert get_reward("registering")("x", "y") == 0.25
