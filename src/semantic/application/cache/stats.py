"""Counters the cache keeps for metrics (read by the HTTP edge)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class CacheStats:
    queried_tokens: int = 0
    hit_tokens: int = 0
    hot_restored_tokens: int = 0
    disk_restored_tokens: int = 0
    corrupt_blocks: int = 0
    blocks_written: int = 0
    bytes_written: int = 0
    write_seconds: float = 0.0
    saves_failed: int = 0
