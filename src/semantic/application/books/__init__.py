"""The KV books: who holds which pool blocks, and why (``KVBooks`` is their one owner)."""
