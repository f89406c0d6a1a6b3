"""duetaspan: telephone voice agents on a full-duplex speech model that calls tools while it keeps talking.

The import package maps the repository layout: `sdk/` is `duetaspan`, `tools/` is `duetaspan.tools` and
`adapters/` is `duetaspan.adapters`. See docs/ARCHITECTURE.md for which module owns what.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("duetaspan")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+local"

# The user-facing API, imported lazily so that `duetaspan --version` and light imports stay fast.
_LAZY = {
    "Agent": "duetaspan.agent",
    "CallInfo": "duetaspan.pipeline.session",
    "tool": "duetaspan.registry",
    "CallContext": "duetaspan.registry",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'duetaspan' has no attribute {name!r}")


__all__ = ["Agent", "CallContext", "CallInfo", "__version__", "tool"]
