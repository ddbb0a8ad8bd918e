"""Rule-based rewards, chosen by ``--rm-type``.

A reward is ``fn(response: str, label) -> float``: `response` is the generated text only (no
prompt), `label` the data set's label (a string, a number, or a list of acceptable answers).
`register_reward` adds one; an entry of `_LAZY` (``name -> "module:function"``) is imported on
first use, so this module stays light (``trainer.arguments`` imports it for the ``--rm-type``
choices); the imported module may instead register the name itself.

The math reward follows DeepScaleR: take the text after the thinking block (an unclosed
``<think>`` scores 0), extract the last ``\\boxed{...}`` (or ``\\fbox{...}``), normalise common
LaTeX and compare with the label as strings, as exact rationals, element-wise for tuples, and
symbolically with sympy when it is installed.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from fractions import Fraction
from typing import Any

RewardFn = Callable[[str, Any], float]

_REGISTRY: dict[str, RewardFn] = {}
_LAZY: dict[str, str] = {"tiny": "trainer.tiny:tiny_reward"}


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
    def decorate(fn: RewardFn) -> RewardFn:
        if name in _REGISTRY and _REGISTRY[name] is not fn:
            raise ValueError(f"reward {name!r} is already registered")
        _REGISTRY[name] = fn
        return fn

    return decorate


def reward_names() -> list[str]:
    return sorted({*_REGISTRY, *_LAZY})


def get_reward(name: str) -> RewardFn:
    if name not in _REGISTRY and name in _LAZY:
        module, attr = _LAZY[name].split(":")
        loaded = importlib.import_module(module)  # may register `name` itself
        if name not in _REGISTRY:
            _REGISTRY[name] = getattr(loaded, attr)
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown reward {name!r}; known: {', '.join(reward_names())}") from None


# --------------------------------------------------------------------------- answer extraction


def strip_thinking(response: str) -> str | None:
    """Text after the last ``</think>``; None when a ``<think>`` block is never closed."""
    if "</think>" in response:
        return response.rsplit("</think>", 1)[1]
    if "<think>" in response:
        return None
    return response


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (nested braces), or None."""
    starts = list(re.finditer(r"\\(?:boxed|fbox)\s*(\{)?", text))
    if not starts:
        return None
    match = starts[-1]
    if match.group(1) is None:  # "\boxed 5" form: up to the next "$" or end of line
        rest = text[match.end() :]
        content = re.split(r"[$\n]", rest, maxsplit=1)[0].strip()
        return content or None
    depth = 0
    for i in range(match.end() - 1, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                content = text[match.end() : i].strip()
                return content or None
    return None


def extract_math_answer(response: str) -> str | None:
    solution = strip_thinking(response)
    return None if solution is None else last_boxed(solution)


# --------------------------------------------------------------------------- normalisation

_UNIT_WORDS = (
    r"(?:degrees?|cm|m|km|mm|inches|inch|feet|foot|ft|units?|dollars?|cents?|"
    r"meters?|seconds?|minutes?|hours?|days?|years?|miles?|pounds?|sq\s*units?)"
)


def _replace_braced_command(text: str, command: str, repl: Callable[[str], str]) -> str:
    """Replace ``\\command{arg}`` (nested braces) by ``repl(arg)``."""
    out = []
    i = 0
    pattern = "\\" + command + "{"
    while (j := text.find(pattern, i)) != -1:
        out.append(text[i:j])
        k, depth = j + len(pattern), 1
        while k < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[k], 0)
            k += 1
        if depth:  # unbalanced: leave the rest alone
            out.append(text[j:])
            return "".join(out)
        out.append(repl(text[j + len(pattern) : k - 1]))
        i = k
    out.append(text[i:])
    return "".join(out)


def _fix_fracs(text: str) -> str:
    """``\\frac12`` -> ``\\frac{1}{2}``, ``\\frac1{2}`` -> ``\\frac{1}{2}``."""
    text = re.sub(r"\\frac\s*(\d)\s*(\d)", r"\\frac{\1}{\2}", text)
    text = re.sub(r"\\frac\s*(\d)\s*\{", r"\\frac{\1}{", text)
    return re.sub(r"\\frac\s*(\{[^{}]*\})\s*(\d)", r"\\frac\1{\2}", text)


def normalize_answer(answer: str) -> str:
    s = answer.strip()
    s = s.replace("\n", "").rstrip(".").strip()
    s = s.replace("\\!", "").replace("\\,", "").replace("\\;", "").replace("\\:", "")
    s = s.replace("\\ ", " ").replace("~", " ")
    s = s.replace("\\displaystyle", "").replace("\\left", "").replace("\\right", "")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = re.sub(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|°", "", s)
    s = s.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "")
    # A trailing unit in \text{...}/\mbox{...} after a number goes; other \text{X} becomes X.
    s = re.sub(r"^([-+]?[\d.,/\\{}frac]+)\s*\\(?:text|mbox|mathrm)\{\s*[a-zA-Z ]+\}$", r"\1", s)
    for command in ("text", "textbf", "mbox", "mathrm", "boxed"):
        s = _replace_braced_command(s, command, lambda x: x)
    s = re.sub(rf"^([-+]?[\d.,]+)\s+{_UNIT_WORDS}$", r"\1", s)
    if s.count("=") == 1 and len(s.split("=")[0].strip()) <= 2:
        s = s.split("=")[1]
    s = re.sub(r"\\sqrt\s*(\w)", r"\\sqrt{\1}", s)
    s = _fix_fracs(s)
    s = s.replace(" ", "").replace("{,}", ",")
    if re.fullmatch(r"[-+]?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    s = re.sub(r"(^|[^\d])\.(\d)", r"\g<1>0.\2", s)
    if m := re.fullmatch(r"(-?\d+)/(\d+)", s):
        s = f"\\frac{{{m.group(1)}}}{{{m.group(2)}}}"
    if m := re.fullmatch(r"\(([A-Za-z])\)", s):
        s = m.group(1)
    return s


_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)"


def to_fraction(s: str) -> Fraction | None:
    """Exact value of a normalised integer, decimal, fraction or mixed number, else None."""
    sign = 1
    if s.startswith("-") and not re.fullmatch(_NUMBER, s):
        sign, s = -1, s[1:]
    if re.fullmatch(_NUMBER, s):
        return sign * Fraction(s)
    if m := re.fullmatch(rf"(\d+)?\\frac\{{({_NUMBER})\}}\{{({_NUMBER})\}}", s):
        whole, num, den = m.groups()
        if Fraction(den) == 0:
            return None
        return sign * (Fraction(whole or 0) + Fraction(num) / Fraction(den))
    return None


# --------------------------------------------------------------------------- equivalence


def _split_top_level(s: str) -> list[str]:
    parts, depth, current = [], 0, []
    for ch in s:
        depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts


def _latex_to_sympy(s: str) -> str:
    s = _replace_braced_command(s, "sqrt", lambda x: f"sqrt({x})")
    while "\\frac{" in s:
        new = re.sub(r"\\frac\{([^{}]*)\}\{([^{}]*)\}", r"((\1)/(\2))", s)
        if new == s:
            break
        s = new
    s = s.replace("\\pi", "pi").replace("\\cdot", "*").replace("\\times", "*")
    s = s.replace("{", "(").replace("}", ")").replace("^", "**")
    return s


_SYMPY_SAFE = re.compile(r"[0-9a-zA-Z+\-*/().\s]*")
_SYMPY_NAMES = {"sqrt", "pi"}


def _sympy_text(s: str) -> str | None:
    """`s` as sympy input, or None when it is not plainly arithmetic.

    ``parse_expr`` evaluates its input with ``eval``: only digits, operators, parentheses,
    single-letter variables, ``sqrt`` and ``pi`` get through, and no power towers.
    """
    text = _latex_to_sympy(s)
    if len(text) > 80 or not _SYMPY_SAFE.fullmatch(text):
        return None
    names = re.findall(r"[a-zA-Z]+", text)
    if any(len(n) > 1 and n not in _SYMPY_NAMES for n in names):
        return None
    if len({n for n in names if len(n) == 1}) > 2 or re.search(
        r"[a-zA-Z]\s*\.|\.\s*[a-zA-Z]", text
    ):
        return None
    if re.search(r"\*\*\s*\(|\*\*\s*[\w.]+\s*\*\*|\*\*\s*\d{3,}", text):
        return None
    return text


def _sympy_equal(a: str, b: str) -> bool:
    """Symbolic equality through sympy, when it is installed (it is optional)."""
    try:
        import sympy
        from sympy.parsing.sympy_parser import (
            implicit_multiplication_application,
            parse_expr,
            standard_transformations,
        )
    except ImportError:
        return False
    texts = [_sympy_text(a), _sympy_text(b)]
    if None in texts:
        return False
    transformations = (*standard_transformations, implicit_multiplication_application)
    try:
        exprs = [
            parse_expr(
                text,
                local_dict={c: sympy.Symbol(c) for c in set(re.findall(r"\b[a-zA-Z]\b", text))},
                transformations=transformations,
            )
            for text in texts
        ]
        return bool(sympy.simplify(exprs[0] - exprs[1]) == 0)
    except Exception:  # sympy raises many types on malformed input
        return False


def _equal_normalized(a: str, b: str) -> bool:
    if a == b:
        return True
    fa, fb = to_fraction(a), to_fraction(b)
    if fa is not None and fb is not None:
        return fa == fb
    brackets = {"(": ")", "[": "]"}
    if (
        a[:1] in brackets
        and a[:1] == b[:1]
        and a[-1:] == brackets[a[0]]
        and b[-1:] == brackets[b[0]]
    ):
        a_parts, b_parts = _split_top_level(a[1:-1]), _split_top_level(b[1:-1])
        if len(a_parts) > 1 and len(a_parts) == len(b_parts):
            return all(map(_equal_normalized, a_parts, b_parts))
    a_parts, b_parts = _split_top_level(a), _split_top_level(b)
    if len(a_parts) > 1 and len(a_parts) == len(b_parts):
        return all(map(_equal_normalized, a_parts, b_parts))
    return _sympy_equal(a, b)


def math_equal(answer: str, label: str) -> bool:
    """Whether a model's answer equals a reference answer, after normalisation."""
    return _equal_normalized(normalize_answer(answer), normalize_answer(label))


def _labels(label: Any) -> list[str]:
    labels = list(label) if isinstance(label, (list, tuple)) else [label]
    out = []
    for item in labels:
        text = str(item)
        out.append(last_boxed(text) or text)
    return out


@register_reward("deepscaler")
@register_reward("math")
def math_reward(response: str, label: Any) -> float:
    answer = extract_math_answer(response)
    if answer is None:
        return 0.0
    return 1.0 if any(math_equal(answer, truth) for truth in _labels(label)) else 0.0


@register_reward("exact_match")
def exact_match_reward(response: str, label: Any) -> float:
    """1 when the answer (after any thinking block) equals the label, whitespace-trimmed."""
    answer = strip_thinking(response)
    return 1.0 if answer is not None and answer.strip() == str(label).strip() else 0.0


@register_reward("prefix_match")
def prefix_match_reward(response: str, label: Any) -> float:
    """1 when the answer starts with the label (the model may keep generating after it)."""
    answer = strip_thinking(response)
    target = str(label).strip()
    return 1.0 if answer is not None and target and answer.lstrip().startswith(target) else 0.0
