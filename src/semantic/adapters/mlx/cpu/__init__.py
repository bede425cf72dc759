"""The CPU accelerator (placeholder: the facade follows)."""
