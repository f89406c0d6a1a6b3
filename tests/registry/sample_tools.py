"""A tool module for `ToolRegistry.add_module` tests."""

from duetaspan.registry import tool

NOT_A_TOOL = 3


@tool
def greet(name: str) -> str:
    """Greet someone."""
    return f"Hello {name}."


@tool(name="shout")
def _shout(text: str) -> str:
    """Upper-case the text."""
    return text.upper()


def helper() -> None:
    """Not decorated, so not registered."""
