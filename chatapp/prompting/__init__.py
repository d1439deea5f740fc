"""Prompting: from messages and tools to the model's prompt text, and from its answer back to calls.

Chat templates, tool formats and their grammars, gpt-oss's harmony format, and the prompt
builder. Nothing here runs the model: the engine needs only a tokenizer (the builder's model
protocol) and the grammars it samples with.
"""
