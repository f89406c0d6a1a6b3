"""Scripted loopback servers (OpenAI-compatible chat, ASR) reused by router, pipeline, example and load tests."""
