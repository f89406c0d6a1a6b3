"""Adapters (`duetaspan.adapters`): the outside world, one package per thing the SDK talks to —
Twilio, WebRTC, ASR servers, the router's LLM, MCP servers."""
