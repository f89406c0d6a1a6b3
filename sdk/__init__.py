"""duetaspan: telephone voice agents on a full-duplex speech model that calls tools while it keeps talking.

The import package maps the repository layout: `sdk/` is `duetaspan`, `tools/` is `duetaspan.tools` and
`adapters/` is `duetaspan.adapters`. See docs/ARCHITECTURE.md for which module owns what.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("duetaspan")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+local"

__all__ = ["__version__"]
