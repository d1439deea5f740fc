"""The model engine: one llama.cpp context owned by one thread, prompts built append-only."""
