"""One process per data directory, whatever happens to the process holding it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from semantic.adapters.storage.data_dir_lock import (
    acquire_data_directory,
    release_data_directory,
)
from semantic.domain.errors import DataDirectoryInUseError, DataDirectoryUnusableError

TRY_TO_HOLD = """
import sys
from pathlib import Path
from semantic.adapters.storage.data_dir_lock import acquire_data_directory
from semantic.domain.errors import DataDirectoryInUseError
try:
    acquire_data_directory(Path(sys.argv[1]))
except DataDirectoryInUseError as error:
    print(error)
    sys.exit(3)
"""


def other_process_holds(directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", TRY_TO_HOLD, str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_another_process_is_refused_with_the_holders_pid_until_the_last_hold_goes(
    tmp_path: Path,
) -> None:
    first = acquire_data_directory(tmp_path / "data")
    second = acquire_data_directory(tmp_path / "data")  # the same process may hold it again
    try:
        refused = other_process_holds(tmp_path / "data")
        assert refused.returncode == 3, refused.stderr
        assert f"pid {os.getpid()}" in refused.stdout
        release_data_directory(second)
        assert other_process_holds(tmp_path / "data").returncode == 3
    finally:
        release_data_directory(first)
    assert other_process_holds(tmp_path / "data").returncode == 0


def test_a_killed_holder_leaves_no_stale_lock(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            TRY_TO_HOLD + "\nprint('held', flush=True)\ninput()\n",
            str(tmp_path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(DataDirectoryInUseError, match=f"pid {holder.pid}"):
        acquire_data_directory(tmp_path)
    holder.kill()
    holder.wait(timeout=60)
    release_data_directory(acquire_data_directory(tmp_path))


def test_a_data_directory_that_is_a_file_is_named_so(tmp_path: Path) -> None:
    (tmp_path / "data").write_text("a file")
    with pytest.raises(DataDirectoryUnusableError, match="is a file, not a directory"):
        acquire_data_directory(tmp_path / "data")


def test_a_data_directory_that_cannot_be_created_says_how_to_fix_it() -> None:
    with pytest.raises(DataDirectoryUnusableError, match=r"cannot be created .* Fix: pass"):
        acquire_data_directory(Path("/proc/no-such-data-dir/inside"))
