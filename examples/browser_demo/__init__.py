"""Browser demo: talk to an agent with the built-in tools from a web page (`duetaspan serve --webrtc`)."""
