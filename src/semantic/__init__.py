"""semantic: a local LLM server that keeps every agent's KV cache."""

__version__ = "0.1.0"
