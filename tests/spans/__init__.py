"""Tests of duetaspan.spans."""
