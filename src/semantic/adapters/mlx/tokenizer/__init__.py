"""The tokenizer behind the ``Tokenizer`` port: chat templates, and the piece cache that
tokenizes only what is new in a returning agent's prompt (ADR 0014)."""
