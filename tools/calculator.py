"""`calculate`: safe arithmetic. The expression is parsed with `ast` and walked; nothing is `eval`ed, and
exponents, factorials and integer sizes are bounded so a request cannot exhaust the CPU or memory.

Example:
    >>> calculate("12 * (3 + 4)")["value"]
    84
    >>> evaluate("2 ^ 10")
    1024
    >>> evaluate("round(2.567, 2)"), evaluate("max(3, 7)"), evaluate("1,000 + 1")
    (2.57, 7, 1001)
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable
from typing import Any

from duetaspan.registry import ToolFailed, tool

MAX_EXPONENT = 1000
MAX_INT_BITS = 4096
MAX_LENGTH = 300

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _factorial(n: float) -> int:
    if n != int(n) or not 0 <= n <= 170:
        raise ToolFailed("factorial needs a whole number from 0 to 170")
    return math.factorial(int(n))


_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "sqrt": math.sqrt, "abs": abs, "round": round, "min": min, "max": max, "floor": math.floor,
    "ceil": math.ceil, "log": math.log, "log10": math.log10, "log2": math.log2, "exp": math.exp,
    "sin": math.sin, "cos": math.cos, "tan": math.tan, "factorial": _factorial,
}  # fmt: skip
# how many arguments each function takes (min, max); None: any number from min up
_ARITY: dict[str, tuple[int, int | None]] = {
    "round": (1, 2), "min": (1, None), "max": (1, None), "log": (1, 2),
}  # fmt: skip
MAX_ROUND_DIGITS = 100
MAX_ARGUMENTS = 50
_CONSTANTS = {"pi": math.pi, "e": math.e, "tau": math.tau}
_SPOKEN = {"×": "*", "÷": "/", "^": "**", "−": "-", "\u2009": "", "\u202f": ""}
# a number written with thousands separators: 1,000 or 12,345,678.5 (groups of exactly three digits)
_GROUPED = re.compile(r"(?<![\w.])\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w.]|,\d)")
_CALL_OPEN = re.compile(r"[A-Za-z_]\w*\s*$")


def _call_depths(text: str) -> list[int]:
    """For each character, how many function-call parentheses enclose it (grouping parentheses do not count)."""
    depths, stack, depth = [], [], 0
    for i, char in enumerate(text):
        if char == "(":
            is_call = bool(_CALL_OPEN.search(text[:i]))
            stack.append(is_call)
            depth += is_call
        elif char == ")" and stack:
            depth -= stack.pop()
        depths.append(depth)
    return depths


def _ungroup(text: str) -> str:
    """Thousands separators removed where they cannot be an argument list's commas.

    Outside a function's parentheses a comma can only group digits ("1,000 + 1"). Inside them ", " separates
    arguments ("round(2.567, 2)", "max(3,7)"), and "1,000" with no space could be either: that is refused
    rather than guessed, since a wrong number read to a caller is worse than none.
    """
    depths = _call_depths(text)
    out, last = [], 0
    for match in _GROUPED.finditer(text):
        if depths[match.start()] > 0:
            raise ToolFailed(
                f"ambiguous comma in {match.group()!r}: write the number without separators "
                "(1000) or separate a function's arguments with ', '"
            )
        out += [text[last : match.start()], match.group().replace(",", "")]
        last = match.end()
    out.append(text[last:])
    return "".join(out)


def _check_arguments(name: str, args: list[Any]) -> None:
    low, high = _ARITY.get(name, (1, 1))
    if len(args) < low or (high is not None and len(args) > high) or len(args) > MAX_ARGUMENTS:
        wanted = f"{low}" if high == low else f"{low} to {high if high is not None else MAX_ARGUMENTS}"
        raise ToolFailed(f"{name} takes {wanted} argument(s), got {len(args)}")
    if name == "round" and len(args) == 2:
        digits = args[1]
        if not isinstance(digits, int) or abs(digits) > MAX_ROUND_DIGITS:
            raise ToolFailed(f"round's digits must be a whole number from -{MAX_ROUND_DIGITS} to {MAX_ROUND_DIGITS}")


def _check_size(value: Any) -> Any:
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise ToolFailed("the result is too large to say")
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolFailed("the result is not a finite number")
    return value


def _eval(node: ast.AST) -> Any:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.Name) and node.id in _CONSTANTS:
        return _CONSTANTS[node.id]
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            if abs(right) > MAX_EXPONENT or (
                isinstance(left, int)
                and isinstance(right, int)
                and abs(left) > 1
                and right * max(abs(left), 2).bit_length() > MAX_INT_BITS
            ):
                raise ToolFailed(
                    f"exponents are limited (at most {MAX_EXPONENT}, results {MAX_INT_BITS} bits)"
                )
        try:
            return _check_size(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise ToolFailed("division by zero") from None
        except OverflowError:
            raise ToolFailed("the result is too large to say") from None
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _FUNCTIONS
        and not node.keywords
    ):
        args = [_check_size(_eval(a)) for a in node.args]
        _check_arguments(node.func.id, args)
        try:
            return _check_size(_FUNCTIONS[node.func.id](*args))
        except ZeroDivisionError:
            raise ToolFailed(f"{node.func.id}: division by zero") from None
        except OverflowError:
            raise ToolFailed(f"{node.func.id}: the result is too large to say") from None
        except (ValueError, TypeError) as exc:
            raise ToolFailed(f"{node.func.id}: {exc}") from None
    raise ToolFailed(f"unsupported expression: {ast.unparse(node) if hasattr(ast, 'unparse') else node!r}")  # fmt: skip


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression (`ToolFailed` when it is not one)."""
    text = expression.strip()
    if len(text) > MAX_LENGTH:
        raise ToolFailed(f"the expression is too long (max {MAX_LENGTH} characters)")
    for spoken, python in _SPOKEN.items():
        text = text.replace(spoken, python)
    text = _ungroup(text)
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ToolFailed(f"not an arithmetic expression: {expression!r}") from None
    value = _eval(tree)
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        value = int(value)
    return value


def format_number(value: int | float) -> str:
    if isinstance(value, int):
        return str(value)
    return f"{value:.10g}"


@tool(render=lambda r: f"{r['expression']} = {r['result']}.")
def calculate(expression: str) -> dict:
    """Evaluate an arithmetic expression exactly (use for any math the caller asks).

    Args:
        expression: arithmetic with + - * / // % ** ( ), and sqrt, abs, round, min, max, floor, ceil, log,
            log10, exp, sin, cos, tan, factorial, pi, e; e.g. "0.15 * 80" or "sqrt(2) * 10"
    """
    value = evaluate(expression)
    return {"expression": " ".join(expression.split()), "value": value, "result": format_number(value)}
