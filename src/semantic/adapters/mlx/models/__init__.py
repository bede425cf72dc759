"""Model provisioning: resolving ``--model`` (embedded names, directories, hub ids), the model
cache and GGUF conversion, the mlx-lm version check and its import, the model's fingerprint,
and which mlx-lm classes a model is built from (``model_parts``)."""
