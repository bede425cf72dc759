"""Option types: each parses one kind of value and refuses what makes no sense, so argparse
itself prints the usage error naming the flag (exit 2) before anything is created or loaded.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from semantic.domain.cache_spec import BLOCK_TOKENS


def positive_int(text: str) -> int:
    value = _int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, not {text}")
    return value


def context_tokens(text: str) -> int:
    """A context of one KV block at least: less could not hold a block of the prompt."""
    value = _int(text)
    if value < BLOCK_TOKENS:
        raise argparse.ArgumentTypeError(
            f"must be at least {BLOCK_TOKENS} (one KV block), not {text}"
        )
    return value


def non_negative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text}")
    return value


def non_negative_float(text: str) -> float:
    value = _float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text}")
    return value


def positive_float(text: str) -> float:
    value = _float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, not {text}")
    return value


def temperature(text: str) -> float:
    """0 to 2, as the OpenAI API takes it: the CLI samples like the server's main route."""
    value = _float(text)
    if not 0 <= value <= 2:
        raise argparse.ArgumentTypeError(f"must be from 0 to 2, not {text}")
    return value


def port(text: str) -> int:
    value = _int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port from 1 to 65535, not {text}")
    return value


def non_empty(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def redis_url(text: str) -> str:
    """A Redis URL (``redis://``, ``rediss://`` or ``unix://``); checked, not connected to.
    The refusal names the scheme only: the rest may hold a password."""
    if not text.startswith(("redis://", "rediss://", "unix://")):
        scheme = text.partition("://")[0] if "://" in text else ""
        given = f"a {scheme}:// URL" if scheme.isalnum() else "no URL"
        raise argparse.ArgumentTypeError(
            f"must be a redis://, rediss:// or unix:// URL, not {given}"
        )
    return text


def path(text: str) -> Path:
    return Path(non_empty(text)).expanduser()


def quotas_file(text: str) -> Path:
    """A quotas file that is there and reads as quotas of valid namespaces, said before
    the model loads; that each holds a block of the model is checked once it has."""
    from semantic.adapters.http.identity import checked_id
    from semantic.domain.errors import InvalidRequestError
    from semantic.domain.quotas import NamespaceQuotas

    given = path(text)
    try:
        quotas = NamespaceQuotas.parse(given.read_text(encoding="utf-8"), smallest=1)
        for namespace in quotas.limited():
            checked_id(namespace, "namespace")
    except OSError as error:
        raise argparse.ArgumentTypeError(f"cannot read {given}: {error.strerror}") from None
    except (InvalidRequestError, UnicodeError) as error:
        raise argparse.ArgumentTypeError(f"{given}: {error}") from None
    return given


def database_url(text: str) -> str:
    """A PostgreSQL URL (``postgresql://`` is taken as ``postgresql+asyncpg://``). SQLite
    is not taken: its file belongs in the data directory, whose lock keeps it to one server.
    Messages never repeat the password."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(non_empty(text))
    except (ArgumentError, ValueError):  # argparse would repeat the text, password and all
        raise argparse.ArgumentTypeError(
            "not a database URL (postgresql+asyncpg://USER:PASSWORD@HOST:PORT/DATABASE)"
        ) from None
    if url.get_backend_name() not in ("postgresql", "postgres") or url.drivername not in (
        "postgresql",
        "postgres",
        "postgresql+asyncpg",
    ):
        shown = url.render_as_string(hide_password=True)
        raise argparse.ArgumentTypeError(
            f"{shown}: semantic keeps its metadata in PostgreSQL (postgresql+asyncpg://...), "
            "or without this flag in SQLite in the data directory"
        )
    return url.set(drivername="postgresql+asyncpg").render_as_string(hide_password=False)


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, not {text}")
    return value
