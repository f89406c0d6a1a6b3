"""Tests of the built-in tools (duetaspan.tools) and the tools CLI."""
