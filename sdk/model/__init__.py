"""The duplex model engine: LM (temporal + depth transformer), Mimi codec, tokenizer, checkpoints, presets,
persona prefill and call slots. It knows nothing of calls, tools or Pipecat."""
