"""Built-in tools (`duetaspan.tools`): time, weather, web search, calculator, end_call and transfer_call.

Each is a plain `@tool` function usable from Python and exportable as an MCP server
(`duetaspan tools serve-mcp`)."""
