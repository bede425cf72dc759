"""``semantic serve``'s parsed flags (and their environment variables) as ``Settings``.

A flag left out falls back to its environment variable, checked as the flag would be, so a
bad value in the environment is a usage error naming the variable, not a failure later.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from semantic.adapters.cli import flags
from semantic.adapters.cli.serve_flags import (
    ALLOWED_HOSTS_ENV,
    DATABASE_URL_ENV,
    PREFAULT_MB,
    SHARED_BLOCKS_ENV,
)
from semantic.adapters.cli.settings import settings_from

if TYPE_CHECKING:
    from semantic.config import Settings


def check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What argparse cannot check flag by flag: the prefault fits in the KV budget."""
    if args.prefault_mb is not None and args.prefault_mb > args.kv_budget_mb:
        parser.error(
            f"argument --prefault-mb: must be at most the KV budget (--kv-budget-mb "
            f"{args.kv_budget_mb}), not {args.prefault_mb}"
        )


def serve_settings(args: argparse.Namespace) -> Settings:
    """The server's settings: the common flags' (``settings_from``) and these."""
    overrides = {**_access(args), **_memory_and_disk(args), **_limits(args)}
    overrides.update(_prefill_overrides(args))
    overrides.update(leases=args.leases, lease_seconds=args.lease_seconds)
    overrides.update(lease_wait_s=args.lease_wait)
    return settings_from(args, **overrides)


def _access(args: argparse.Namespace) -> dict[str, object]:
    """Where it listens, who may call it, and where its data lives."""
    return {
        "host": args.host,
        "port": args.port,
        "api_key": args.api_key or os.environ.get("SEMANTIC_API_KEY") or None,
        "cors_origins": tuple(args.cors_origin),
        "allowed_hosts": _allowed_hosts(args.allowed_host),
        "api_keys_file": args.api_keys_file or _env_path("SEMANTIC_API_KEYS_FILE"),
        "shared_blocks_url": _shared_blocks(args),
        "database_url": _database_url(args),
    }


def _memory_and_disk(args: argparse.Namespace) -> dict[str, object]:
    """The KV budget, the prefault and the disk's quota and reserve, in bytes."""
    prefault_mb = args.prefault_mb if args.prefault_mb is not None else PREFAULT_MB
    return {
        "kv_budget_bytes": args.kv_budget_mb << 20,
        "prefault_bytes": min(prefault_mb, args.kv_budget_mb) << 20,
        "kv_at_rest": args.kv_at_rest,
        "disk_quota_bytes": None if args.disk_quota_mb is None else args.disk_quota_mb << 20,
        "disk_reserve_bytes": args.disk_reserve_mb << 20,
        "eviction": args.eviction,
        "namespace_quotas_file": args.namespace_quotas,
    }


def _limits(args: argparse.Namespace) -> dict[str, object]:
    """Requests, queue, connections and the shutdown's grace."""
    return {
        "max_tokens_cap": args.max_tokens_cap,
        "max_context": args.max_context,
        "max_waiting": args.max_waiting,
        "grace_s": args.grace,
        "max_connections": args.max_connections,
        "header_timeout_s": args.header_timeout,
        "body_timeout_s": args.body_timeout,
    }


def _prefill_overrides(args: argparse.Namespace) -> dict[str, object]:
    """Only the pacing flags given: the others keep ``Settings``' defaults (0: off)."""
    overrides: dict[str, object] = {}
    if args.prefill_budget is not None:
        overrides["prefill_fixed_tokens"] = args.prefill_budget
    if args.prefill_ride is not None:
        overrides["prefill_ride_ratio"] = args.prefill_ride or None
    if args.prefill_slice is not None:
        overrides["prefill_slice_ratio"] = args.prefill_slice or None
    if args.prefill_idle_slice is not None:
        overrides["prefill_idle_slice_s"] = args.prefill_idle_slice or None
    return overrides


def _allowed_hosts(given: list[str]) -> tuple[str, ...]:
    """``--allowed-host`` names, else ``$SEMANTIC_ALLOWED_HOSTS``'s."""
    listed = given or os.environ.get(ALLOWED_HOSTS_ENV, "").split(",")
    return tuple(name.strip() for name in listed if name.strip())


def _database_url(args: argparse.Namespace) -> str | None:
    """``--database-url``, else ``$SEMANTIC_DATABASE_URL``'s, checked as the flag is."""
    if args.database_url is not None:
        return str(args.database_url)
    value = os.environ.get(DATABASE_URL_ENV)
    if not value:
        return None
    try:
        return flags.database_url(value)
    except argparse.ArgumentTypeError as error:
        parser: argparse.ArgumentParser = args.parser
        parser.error(f"${DATABASE_URL_ENV}: {error}")


def _shared_blocks(args: argparse.Namespace) -> str | None:
    """``--shared-blocks``, else ``$SEMANTIC_SHARED_BLOCKS``'s, checked as the flag is."""
    if args.shared_blocks is not None:
        return str(args.shared_blocks)
    value = os.environ.get(SHARED_BLOCKS_ENV)
    if not value:
        return None
    try:
        return flags.redis_url(value)
    except argparse.ArgumentTypeError as error:
        parser: argparse.ArgumentParser = args.parser
        parser.error(f"${SHARED_BLOCKS_ENV}: {error}")


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value).expanduser() if value else None
