"""The call viewer: one self-contained HTML page per recorded call (`duetaspan view CALL.json`).

`timeline.build_view` turns a call record (see `duetaspan.pipeline.artifacts`) into what the page draws;
`page.render_call` writes the page, with the wav's waveforms and (optionally) its audio inside.

Example:
    >>> from duetaspan.view import render_call          # doctest: +SKIP
    >>> render_call("calls/CA123.json", "CA123.html")   # doctest: +SKIP
"""

from duetaspan.view.page import ViewError, call_page, render_call, render_html
from duetaspan.view.timeline import build_view

__all__ = ["ViewError", "build_view", "call_page", "render_call", "render_html"]
