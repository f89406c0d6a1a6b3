"""Weather and time concierge: every tool comes from an MCP server (our built-ins over MCP, mcp-server-time)."""
