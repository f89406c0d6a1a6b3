"""Reliability and security: load, call-level faults, hostile input, secrets (issue #9)."""
