"""Math answer grading with the meaning of miles' ``rm_hub`` (``--rm-type deepscaler`` / ``math``).

miles grades with the DeepScaleR checker (itself Hendrycks' MATH normalisation plus a sympy
comparison). A reward that grades differently cannot reproduce miles' runs, so its rules are kept
here on purpose, quirks included:

- the answer is the content of the last ``\\boxed{...}`` (braces required; ``\\fbox`` and
  ``\\boxed 7`` give no answer);
- `equal_mathd`: string equality after the MATH normalisation (``\\frac12`` -> ``\\frac{1}{2}``,
  units after ``\\text{ `` dropped, ``x = 5`` -> ``5``, ...);
- `equal_sympy`: a looser normalisation (units, ``and``/``or`` lists, case, LaTeX to text through
  pylatexenc), element-wise for tuples and intervals; an unreduced fraction never equals a reduced
  one, an integer label needs an integer answer, else ``sympy.simplify(a - b) == 0``;
- ``deepscaler`` grades only the text after ``</think>`` (or ``###Response``): a response without
  it scores 0; ``math`` grades the whole response.

Deliberate differences: a list label is a set of acceptable answers (miles accepts one), and two
inputs miles would crash or hang on are graded 0 here: an answer that normalises to infinity
(``int(round(inf))`` raises there), and one with ``**``, which sympy would evaluate (power towers).
"""

from __future__ import annotations

import contextlib
import re
from typing import Any

_UNITS = (
    "degree", "cm", "centimeter", "meter", "mile", "second", "minute", "hour", "day", "week",
    "month", "year", "foot", "feet", "inch", "yard",
)  # fmt: skip
_TEXT_ONLY = re.compile(r"^\\text\{(?P<text>.+?)\}$")
_FRACTION = re.compile(r"^-?[0-9]+.?/0*[1-9][0-9]*.?$")
_THOUSANDS = re.compile(r"(\d)(,)(\d\d\d)($|\D)")
_BRACKETS = "()[]"


# --------------------------------------------------------------------------- extraction


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (nested braces); None without braces or closing."""
    start = text.rfind("\\boxed")
    if start < 0:
        return None
    depth = 0
    for end in range(start, len(text)):
        if text[end] == "{":
            depth += 1
        elif text[end] == "}":
            depth -= 1
            if depth == 0:
                whole = text[start : end + 1]
                prefix = "\\boxed{"
                return whole[len(prefix) : -1] if whole.startswith(prefix) else None
    return None


# --------------------------------------------------------------------------- MATH normalisation


def _units_after_text_space(s: str) -> str:
    """``5\\text{ cm}`` -> ``5``; a second ``\\text{ `` is an error (the answer stays as is)."""
    if "\\text{ " not in s:
        return s
    parts = s.split("\\text{ ")
    if len(parts) != 2:
        raise ValueError("several \\text{ units")
    return parts[0]


def _braced_sqrt(s: str) -> str:
    """``\\sqrt3`` -> ``\\sqrt{3}`` (one character); a trailing ``\\sqrt`` is an error."""
    head, *rest = s.split("\\sqrt")
    out = [head]
    for part in rest:
        if not part:
            raise ValueError("\\sqrt without argument")
        out.append("\\sqrt" + part if part[0] == "{" else "\\sqrt{" + part[0] + "}" + part[1:])
    return "".join(out)


def _braced_fracs(s: str) -> str:
    """``\\frac12`` -> ``\\frac{1}{2}``, ``\\frac1{2}`` -> ``\\frac{1}{2}``; a trailing ``\\frac``
    is an error, a one-character argument leaves the string unchanged."""
    head, *rest = s.split("\\frac")
    out = head
    for part in rest:
        out += "\\frac"
        if not part:
            raise ValueError("\\frac without argument")
        if part[0] == "{":
            out += part
        elif len(part) < 2:
            return s
        elif part[1] != "{":
            out += "{" + part[0] + "}{" + part[1] + "}" + part[2:]
        else:
            out += "{" + part[0] + "}" + part[1:]
    return out


def _slash_to_frac(s: str) -> str:
    """``3/4`` -> ``\\frac{3}{4}`` when both sides are plain integers."""
    parts = s.split("/")
    if len(parts) != 2:
        return s
    try:
        a, b = int(parts[0]), int(parts[1])
    except ValueError:
        return s
    return f"\\frac{{{a}}}{{{b}}}" if s == f"{a}/{b}" else s


def _mathd_strip(s: str) -> str:
    s = s.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "").replace("\\$", "")
    s = _units_after_text_space(s)
    s = s.replace("\\%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:
        s = sides[1]
    s = _braced_sqrt(s).replace(" ", "")
    s = _braced_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _slash_to_frac(s)


def mathd_normalize(answer: str) -> str:
    """The MATH data set's answer normalisation (on any error: the answer, trimmed)."""
    answer = answer.strip()
    if match := _TEXT_ONLY.search(answer):
        answer = match.group("text").strip()
    try:
        return _mathd_strip(answer)
    except ValueError:
        return answer


def equal_mathd(given: str, truth: str) -> bool:
    return mathd_normalize(given) == mathd_normalize(truth)


# --------------------------------------------------------------------------- sympy comparison


def _is_float(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def _is_int_value(x: float) -> bool:
    try:
        return abs(x - round(x)) <= 1e-7
    except (OverflowError, ValueError):
        return False


def _strip_thousands(s: str) -> str:
    while (next_s := _THOUSANDS.sub(r"\1\3\4", s)) != s:
        s = next_s
    return s


def _str_is_int(s: str) -> bool:
    try:
        value = float(_strip_thousands(s))
    except ValueError:
        return False
    if value in (float("inf"), float("-inf")):
        raise _Infinite
    return _is_int_value(value)


class _Infinite(Exception):
    """An answer that normalises to infinity (miles raises; graded 0 here)."""


def _latex_to_text(s: str) -> str:
    from pylatexenc.latex2text import LatexNodes2Text

    s = s.replace("\\tfrac", "\\frac").replace("\\dfrac", "\\frac").replace("\\frac", " \\frac")
    s = LatexNodes2Text().latex_to_text(s)
    for symbol, name in (("√", "sqrt"), ("π", "pi"), ("∞", "inf"), ("∪", "U"), ("·", "*")):
        s = s.replace(symbol, name)
    return s.replace("×", "*").strip()


def sympy_normalize(expr: str) -> str:
    """The looser normalisation of the sympy comparison."""
    if match := _TEXT_ONLY.search(expr):
        expr = match.group("text")
    expr = expr.replace("\\%", "%").replace("\\$", "$").replace("$", "").replace("%", "")
    expr = expr.replace(" or ", " , ").replace(" and ", " , ")
    expr = expr.replace("million", "*10^6").replace("billion", "*10^9")
    expr = expr.replace("trillion", "*10^12")
    for unit in _UNITS:
        expr = re.sub(rf"{unit}(es)?(s)? *(\^[0-9]+)?", "", expr)
    expr = re.sub(r"\^ *\\circ", "", expr)
    if expr[:1] == "{" and expr[-1:] == "}":
        expr = expr[1:-1]
    expr = re.sub(r",\\! *", "", expr)
    if _is_float(expr) and _is_int_value(float(expr)):
        expr = str(round(float(expr)))
    if "\\" in expr:
        with contextlib.suppress(Exception):  # pylatexenc raises several types
            expr = _latex_to_text(expr)
    expr = re.sub(r"- *", "-", expr)
    expr = re.sub(r"([0-9]) +([0-9])", r"\1+\2", expr)  # mixed number 7 3/4 -> 7+3/4
    expr = expr.replace(" ", "").replace("{", "").replace("}", "").lower()
    if _str_is_int(expr):
        expr = str(int(float(expr.replace(",", ""))))
    return expr


def _split_tuple(expr: str) -> list[str]:
    expr = _strip_thousands(expr)
    if not expr:
        return []
    inner = expr[1:-1]
    if (
        len(expr) > 2
        and expr[0] in _BRACKETS
        and expr[-1] in _BRACKETS
        and not any(c in inner for c in _BRACKETS)
    ):
        return [element.strip() for element in inner.split(",")]
    return [expr]


def _may_evaluate(expr: str) -> bool:
    """At most two unknown letters, no power towers, no ``**`` typed by the model."""
    letters = {c for c in expr.replace("sqrt", "").replace("frac", "") if c.isalpha()}
    if len(letters) > 2 or "^{" in expr or "^(" in expr or "**" in expr:
        return False
    return not re.search(r"\^[0-9]+\^|\^[0-9][0-9]+", expr)


def _sympy_zero_difference(truth: str, given: str) -> bool:
    import sympy
    from sympy.parsing import sympy_parser

    expr = f"({truth})-({given})"
    if not _may_evaluate(expr):
        return False
    transformations = (
        *sympy_parser.standard_transformations,
        sympy_parser.implicit_multiplication_application,
    )
    try:
        parsed = sympy_parser.parse_expr(expr.replace("^", "**"), transformations=transformations)
        return bool(sympy.simplify(parsed) == 0)
    except Exception:  # sympy raises many types on malformed input
        return False


def equal_sympy(given: str, truth: str) -> bool:
    try:
        truth_n, given_n = sympy_normalize(truth), sympy_normalize(given)
        if truth_n == given_n:
            return True
        if not given_n:
            return False
        truth_parts, given_parts = _split_tuple(truth_n), _split_tuple(given_n)
        if len(truth_parts) > 1 and (truth_n[0] != given_n[0] or truth_n[-1] != given_n[-1]):
            return False
        if len(truth_parts) != len(given_parts):
            return False
        for t, g in zip(truth_parts, given_parts, strict=True):
            if _FRACTION.search(t) and _FRACTION.search(g):
                equal = t == g  # an unreduced fraction is not the reduced one
            elif _str_is_int(t) != _str_is_int(g):
                equal = False  # an integer needs an integer, not something that simplifies to it
            else:
                equal = _sympy_zero_difference(t, g)
            if not equal:
                return False
        return True
    except _Infinite:
        return False


def equal(given: str, truth: str) -> bool:
    return equal_mathd(given, truth) or equal_sympy(given, truth)


# --------------------------------------------------------------------------- rewards


def _labels(label: Any) -> list[Any]:
    return list(label) if isinstance(label, (list, tuple)) else [label]


def _matches(answer: str, labels: list[Any]) -> bool:
    """Whether `answer` equals one of the labels; a boxed label counts by its last boxed
    content; an empty label (None or "") matches nothing."""
    for item in labels:
        truth = None if item is None else str(item)
        if truth and "\\boxed" in truth:
            truth = last_boxed(truth)
        if truth and equal(answer, truth):
            return True
    return False


def deepscaler_reward(response: str, label: Any) -> float:
    """miles' ``deepscaler``: the boxed answer after ``</think>`` (or ``###Response``)."""
    if "</think>" in response:
        solution = response.split("</think>")[-1]
    elif "###Response" in response:
        solution = response.split("###Response")[1]
    else:
        return 0.0
    answer = last_boxed(solution)
    return float(answer is not None and _matches(answer, _labels(label)))


def math_reward(response: str, label: Any) -> float:
    """miles' ``math``: the last boxed answer anywhere in the response; an empty label is 0."""
    answer = last_boxed(response)
    # miles' math skips every falsy label, a numeric 0 included (graded as no label)
    labels = [item for item in _labels(label) if item]
    return float(answer is not None and _matches(answer, labels))
