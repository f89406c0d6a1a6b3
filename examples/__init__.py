"""Example bots (`examples/<name>/`): each a runnable agent (README, agent.toml, tools) with its end-to-end test."""
