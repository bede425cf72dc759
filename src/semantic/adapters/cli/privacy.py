"""Private by default on disk: what the server writes, only its user may read.

The data directory holds every tenant's transcripts. The server's umask makes everything
it creates there (the directory, ``semantic.db`` and its ``-wal``/``-shm``, block files,
the lock file) readable by its user alone, whatever the login shell's umask says; a
directory that already lets others in is left as its owner made it, with a warning.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger(__name__)

PRIVATE_UMASK = 0o077


def keep_private(data_dir: Path) -> None:
    """From now on, files this process creates are its user's alone; warn if ``data_dir``
    already lets others read it."""
    os.umask(PRIVATE_UMASK)
    try:
        found = data_dir.stat()
    except OSError:  # not there yet (it will be made private) or unusable (said later)
        return
    mode = stat.S_IMODE(found.st_mode)
    if stat.S_ISDIR(found.st_mode) and mode & 0o077:  # not a directory: said later
        log.warning(
            "the data directory %s is open to other users (mode %o): they may read every "
            "tenant's transcripts; `chmod 700 %s` keeps it private",
            data_dir,
            mode,
            data_dir,
        )
