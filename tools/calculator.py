"""`calculate`: safe arithmetic. The expression is parsed with `ast` and walked; nothing is `eval`ed, and
exponents, factorials and integer sizes are bounded so a request cannot exhaust the CPU or memory.

Example:
    >>> calculate("12 * (3 + 4)")["value"]
    84
    >>> evaluate("2 ^ 10")
    1024
"""

from __future__ import annotations

import ast
import math
import operator
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
_CONSTANTS = {"pi": math.pi, "e": math.e, "tau": math.tau}
_SPOKEN = {"×": "*", "÷": "/", "^": "**", "−": "-", ",": ""}


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
        args = [_eval(a) for a in node.args]
        try:
            return _check_size(_FUNCTIONS[node.func.id](*args))
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
