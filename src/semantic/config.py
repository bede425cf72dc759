"""Where things live on disk, and the settings a user can change.

Read once by the composition root (``semantic.bootstrap``) and the CLI; the inner rings get
plain values passed down, never this module.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

DATA_DIR_ENV = "SEMANTIC_DATA_DIR"
MODEL_CACHE_ENV = "SEMANTIC_MODEL_CACHE"
DEFAULT_MODEL = "smollm2-135m-instruct"


def default_data_dir() -> Path:
    """Per-user data directory: KV blocks and the database live here."""
    if explicit := os.environ.get(DATA_DIR_ENV):
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "semantic"


def default_model_cache_dir() -> Path:
    """Per-user model cache, shared by every data directory so a model is fetched once."""
    if explicit := os.environ.get(MODEL_CACHE_ENV):
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "semantic" / "models"


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything a user can set; each field maps to a CLI option of ``semantic serve``."""

    data_dir: Path = field(default_factory=default_data_dir)
    model_cache_dir: Path = field(default_factory=default_model_cache_dir)
    model: str = DEFAULT_MODEL
    weights: str = "auto"
    device: str = "auto"
    """MLX device for the model: ``auto`` (MLX's default, a GPU where it has one), ``cpu``,
    ``gpu``."""
    kv_budget_bytes: int = 2 << 30
    prefault_bytes: int = 1 << 30
    """Memory touched once the server answers (restore buffers, then heap), so the first
    restores after a restart do not page-fault."""
    kv_at_rest: str = "lossless"
    """How block files hold KV: exact, or 8-/4-bit (smaller files, slightly different KV)."""
    default_max_tokens: int = 512
    max_tokens_cap: int = 4096
    max_context: int | None = None
    """Tokens of context served, prompt and reply (None: the model's own window); fewer
    bound every agent's KV (and let a test reach the window quickly)."""
    prefill_chunk_tokens: int = 256
    prefill_fixed_tokens: int | None = None
    """A fixed prefill budget per engine step; None: 1,024 tokens while nothing decodes, 64
    per waiting prompt while streams decode (ADR 0009)."""
    prefill_ride_ratio: float | None = 3.0
    """A lone waiting prompt's chunk rides the decode step when that is predicted to add
    at most this many decode steps' time (with slicing off, every chunk rides, sized so);
    None: passes of its own (ADR 0009 has the trade-off)."""
    prefill_slice_ratio: float | None = 1.8
    """A lone waiting prompt too long to ride is computed a few layers at a time between the
    streams' decode steps (beside them, on a core of its own while their step's body runs),
    each round held to 1 + this many of their steps as they were before it came; None: it
    rides in smaller chunks (ADR 0009, 0015)."""
    prefill_idle_slice_s: float | None = 0.25
    """With nothing decoding, a lone prompt is computed a few layers at a time for this
    many seconds a round, so a request arriving meanwhile is admitted within about that
    long, not after a 1,024-token pass (~3 s here); None: whole passes (ADR 0009)."""
    max_running: int = 32
    max_waiting: int = 256
    disk_quota_bytes: int | None = None
    namespace_quotas_file: Path | None = None
    """Hard limits per namespace (JSON, ``NamespaceQuotas.parse``), read at start."""
    eviction: str = "agent"
    """Memory's eviction order: retention hints then LRU (``agent``), or LRU (``lru``)."""
    disk_reserve_bytes: int = 1 << 30
    """Free disk to keep: cached KV gives way, oldest first, before the disk fills."""
    shared_blocks_url: str | None = None
    """A Redis URL: the block tier instances share (ADR 0022); None: none."""
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    cors_origins: tuple[str, ...] = ()
    """Web origins whose pages may call the server from a browser ("*": any); none by
    default, so a page on another site cannot drive a local server through its user's
    browser."""
    allowed_hosts: tuple[str, ...] = ()
    """Host names a request's ``Host`` may give besides loopback names, addresses and the
    bound host: a name the server is reached by, else 421 (a DNS rebinding page's name)."""
    api_keys_file: Path | None = None
    """Hashed API keys, each bound to a namespace or to all (``semantic keys add``)."""
    grace_s: float = 30.0
    max_body_bytes: int = 4 << 20
    max_connections: int | None = None
    """Connections held at once; None: as many as the descriptor limit allows, up to 4,096,
    a reserve kept for the server's own files."""
    header_timeout_s: float = 10.0
    """A request's headers must arrive within this long of the connection (or the previous
    response); a slow client cannot hold a connection open with a request it never ends."""
    body_timeout_s: float = 30.0
    """A request's body must arrive within this long of its headers."""
    database_url: str | None = None
    """Where agents, transcripts and block metadata live (``postgresql+asyncpg://...``);
    None: SQLite in the data directory."""
    leases: bool = False
    """Agents' turns take a lease in the database (instances sharing it; ADR 0025)."""
    lease_seconds: float = 30.0
    lease_wait_s: float = 5.0

    def __post_init__(self) -> None:
        if self.weights not in WEIGHT_CHOICES:
            raise ValueError(f"weights must be one of {', '.join(WEIGHT_CHOICES)}")
        if self.kv_at_rest not in KV_AT_REST_CHOICES:
            raise ValueError(f"kv_at_rest must be one of {', '.join(KV_AT_REST_CHOICES)}")
        for name in (
            "kv_budget_bytes",
            "default_max_tokens",
            "max_tokens_cap",
            "prefill_chunk_tokens",
            "max_running",
            "max_waiting",
            "max_body_bytes",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.max_context is not None and self.max_context < 256:
            raise ValueError("max_context must be at least 256 (one KV block)")
        if self.max_connections is not None and self.max_connections <= 0:
            raise ValueError("max_connections must be positive")
        if not (self.header_timeout_s > 0 and self.body_timeout_s > 0):
            raise ValueError("header_timeout_s and body_timeout_s must be positive")
        if self.prefill_ride_ratio is not None and not self.prefill_ride_ratio > 0:
            raise ValueError("prefill_ride_ratio must be positive")
        if self.prefill_slice_ratio is not None and not self.prefill_slice_ratio > 0:
            raise ValueError("prefill_slice_ratio must be positive")
        if self.prefill_idle_slice_s is not None and not self.prefill_idle_slice_s > 0:
            raise ValueError("prefill_idle_slice_s must be positive")


WEIGHT_CHOICES = ("auto", "float32", "float16", "bf16", "quantized", "q4", "q8")
KV_AT_REST_CHOICES = ("lossless", "q8", "q4")
