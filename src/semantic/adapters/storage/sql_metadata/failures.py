"""The metadata database's failures as the domain's errors: storage unavailable (503), or a
full disk naming the directory."""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

from semantic.domain.errors import DiskFullError, StorageUnavailableError

P = ParamSpec("P")
R = TypeVar("R")


def unavailable_on_failure(
    method: Callable[P, Coroutine[Any, Any, R]],
) -> Callable[P, Coroutine[Any, Any, R]]:
    """SQLite's own failures (a read-only or full disk, a database locked past its busy
    timeout) become ``StorageUnavailableError``: the edge answers 503 naming the storage,
    not 500; a full disk becomes ``DiskFullError``, naming the directory, so the caller can
    free room and try again. PostgreSQL out of reach (refused, timed out, a connection lost
    mid-transaction) is unavailable too. The transaction was rolled back (PostgreSQL rolls
    back what a lost connection left open), so nothing half-done is kept."""

    @functools.wraps(method)
    async def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await method(*args, **kwargs)
        except OperationalError as error:
            if _disk_full(error):
                path = getattr(args[0], "path", None)
                where = path.parent if isinstance(path, Path) else "?"
                raise DiskFullError(
                    f"the disk holding the data directory {where} is full ({error.orig})"
                ) from error
            raise StorageUnavailableError(f"the metadata store failed: {error.orig}") from error
        except IntegrityError as error:  # a change that raced another (a cut block), undone
            raise StorageUnavailableError(
                f"the metadata store refused a change that raced another ({error.orig}); try again"
            ) from error
        except DBAPIError as error:  # PostgreSQL: a connection lost in the middle, a timeout
            raise StorageUnavailableError(f"the metadata store failed: {error.orig}") from error
        except (OSError, TimeoutError) as error:  # PostgreSQL: no connection could be made
            raise StorageUnavailableError(
                f"the metadata database cannot be reached ({error}); try again"
            ) from error

    return guarded


_SQLITE_FULL = 13


def _disk_full(error: OperationalError) -> bool:
    """SQLite's own code for a write that found no room (``SQLITE_FULL``, any variant)."""
    code = getattr(error.orig, "sqlite_errorcode", None)
    return (isinstance(code, int) and code & 0xFF == _SQLITE_FULL) or "disk is full" in str(
        error.orig
    )
