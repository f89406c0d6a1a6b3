"""Tests of duetaspan.adapters.mcp."""
