"""`chatapp serve`: the engine and its prefix cache behind the OpenAI and Ollama HTTP APIs."""
