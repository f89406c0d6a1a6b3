"""Tests of duetaspan.registry."""
