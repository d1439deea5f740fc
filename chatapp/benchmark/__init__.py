"""The peer benchmark: chatapp against other ways of serving the same prompts."""
