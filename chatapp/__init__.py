"""chatapp: a terminal chat app for local GGUF models with a persistent prefix KV cache."""

from chatapp.openmp_policy import keep_openmp_spinning

__version__ = "0.1.0"

keep_openmp_spinning()  # before anything loads llama.cpp
