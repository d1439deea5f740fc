"""The GGUF models already on this machine: where other tools keep them, and what each file holds."""
