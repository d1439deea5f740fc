"""chatapp: a terminal chat app for local GGUF models with a persistent prefix KV cache."""

__version__ = "0.1.0"
