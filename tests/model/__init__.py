"""Tests of duetaspan.model."""
