"""OpenAI-compatible chat-completions client used by the router (native `tools` calling or plain text)."""

from duetaspan.adapters.llm.openai_chat import ChatClient, ChatReply, LLMError, LLMTimeout, ToolCallRequest

__all__ = ["ChatClient", "ChatReply", "LLMError", "LLMTimeout", "ToolCallRequest"]
