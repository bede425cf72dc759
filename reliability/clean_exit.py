"""Clean exits: start and stop the services twice in one process, many times; every process
must exit 0 (threads that touched MLX once made about one run in six abort at exit, see
``semantic.application.threads``).

    python -m reliability.clean_exit [--runs 12]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

CHILD = """
import asyncio, sys
from pathlib import Path
from semantic.adapters.mlx.cpu import prepare_process
prepare_process()
from semantic.adapters.cli.progress import ProgressPrinter
from semantic.bootstrap import start_services, stop_services
from semantic.config import Settings

async def main() -> None:
    for _ in range(2):
        services = await start_services(Settings(data_dir=Path(sys.argv[1])), ProgressPrinter())
        await stop_services(services, grace_s=5)

asyncio.run(main())
"""


@dataclass
class ExitReport:
    runs: int = 0
    clean: int = 0
    failures: list[str] = field(default_factory=list)


def run(runs: int, workdir: Path) -> ExitReport:
    report = ExitReport()
    for index in range(runs):
        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(workdir / f"exit-{index}")],
            capture_output=True,
            check=False,
            text=True,
            timeout=600,
        )
        report.runs += 1
        if done.returncode == 0:
            report.clean += 1
        else:
            tail = done.stderr.strip().splitlines()[-1:] or [""]
            report.failures.append(f"run {index}: exit {done.returncode}: {tail[0]}")
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=12)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report = run(args.runs, Path(tmp))
    print(f"clean exits: {report.clean} of {report.runs}")
    for failure in report.failures:
        print("  " + failure)


if __name__ == "__main__":
    main()
