"""The KV codec: mlx-lm caches cut into 256-token blocks and gathered back (``kv_blocks``),
the blocks' payloads in memory and at rest (``kv_payloads``, ``host_codec``), the restore
buffers they are copied into, a restored prefix read where it lies, and cache growth."""
