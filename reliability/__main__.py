"""Run every reliability suite at full length and print one summary table.

python -m reliability            # about an hour on a 2-core machine
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from reliability import (
    clean_exit,
    cluster_load,
    corruption,
    crash_load,
    crash_responses,
    full_disk,
    fuzz,
    isolation,
    load,
    returning_together,
    slow_clients,
)


def main() -> None:
    rows: list[tuple[str, str]] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        served = load.run(agents=32, turns=10, workdir=work)
        rows += [
            ("requests served (32 agents x 10 turns)", str(served.requests)),
            ("5xx responses", str(served.server_errors)),
            ("transcripts lost", str(served.transcripts_lost)),
            ("peak server memory (MB)", f"{served.peak_rss_mb:.0f}"),
            ("pool blocks still held after the load", f"{served.pool_blocks_held_by_requests:.0f}"),
        ]
        crashed = crash_load.run(kills=20, agents=6, workdir=work)
        rows += [
            ("crash trials survived", f"{crashed.survived} of {crashed.kills}"),
            ("replies acknowledged before kills", str(crashed.acknowledged)),
        ]
        chained = crash_responses.run(trials=10, chains=3, workdir=work)
        rows += [
            ("Responses crash trials survived", f"{chained.survived} of {chained.trials}"),
            ("responses acknowledged before kills", str(chained.acknowledged)),
        ]
        damaged = corruption.run(rounds=8, workdir=work)
        rows += [
            ("corruptions detected", f"{damaged.detected} of {damaged.injected}"),
            (
                "answered correctly after corruption",
                f"{damaged.answered_correctly} of {damaged.injected}",
            ),
        ]
        fuzzed = fuzz.run(examples=40, workdir=work)
        rows += [
            ("fuzz cases tried", str(fuzzed.cases)),
            ("fuzz 5xx found", str(fuzzed.server_errors)),
        ]
        isolated = isolation.run(work)
        rows.append(("isolation cases refused", f"{isolated.refused} of {isolated.tried}"))
        returned = returning_together.run(agents=6, budget_mb=256, words=150, workdir=work)
        rows.append(
            (
                "agents back together beyond memory, restored whole",
                f"{len(returned.cached) - len(returned.failures)} of {len(returned.cached)}",
            )
        )
        slow = slow_clients.run(sockets=3000, seconds=40, workdir=work)
        rows += [
            (
                "slow-client flood (3,000 sockets, 40 s, server at 2,048 descriptors)",
                f"{slow.connections} connections; ended "
                + ", ".join(f"{how} {count}" for how, count in sorted(slow.answered.items())),
            ),
            (
                "longest a slow socket was held (headers 10 s, body 30 s allowed)",
                ", ".join(f"{kind} {s:.1f} s" for kind, s in sorted(slow.longest_held_s.items())),
            ),
            (
                "ordinary requests during the flood: slowest (s), failed; slowest before it",
                f"{max(slow.ordinary_s, default=0):.2f}, {len(slow.ordinary_failures)}; "
                f"{max(slow.before_s, default=0):.2f}",
            ),
            ("server log during the flood (bytes)", str(slow.log_bytes)),
        ]
        exits = clean_exit.run(runs=12, workdir=work)
        rows.append(("clean exits after two starts and stops", f"{exits.clean} of {exits.runs}"))
        filled = full_disk_rows(work, rows)
        clustered = cluster_rows(work, rows)
        failures = (
            served.failures
            + crashed.failures
            + damaged.failures
            + fuzzed.failures
            + isolated.failures
            + returned.failures
            + slow.failures
            + exits.failures
            + filled
            + clustered
        )
    width = max(len(name) for name, _ in rows)
    print(f"{'check':<{width}}  result")
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    print(f"\n{len(failures)} failures; took {(time.monotonic() - started) / 60:.0f} min")
    for failure in failures[:40]:
        print("  " + failure)


def cluster_rows(work: Path, rows: list[tuple[str, str]]) -> list[str]:
    """24 agents x 6 turns through HAProxy across 3 instances on one PostgreSQL and Redis."""
    spread = cluster_load.run(agents=24, turns=6, workdir=work)
    rows += [
        ("cluster: requests through HAProxy (24 agents x 6 turns)", str(spread.requests)),
        ("cluster: 5xx responses", str(spread.server_errors)),
        ("cluster: transcripts lost", str(spread.transcripts_lost)),
        ("cluster: 409 agent_busy, retried", str(spread.busy)),
        ("cluster: requests away from their agent's usual instance", str(spread.away)),
        (
            "cluster: requests per instance",
            ", ".join(f"{name} {count}" for name, count in sorted(spread.served_by.items())),
        ),
    ]
    return spread.failures


def full_disk_rows(work: Path, rows: list[tuple[str, str]]) -> list[str]:
    """The full-disk suite's figures (it needs root to mount its tmpfs); its failures."""
    try:
        filled = full_disk.run(work)
    except full_disk.MountRefusedError as error:
        rows.append(("full disk", f"skipped: no tmpfs ({error})"))
        return []
    recovery = "never" if filled.recovery_s is None else f"{filled.recovery_s:.2f} s"
    lowest = min((free for _, free in filled.free_mb), default=0.0)
    rows += [
        (
            "full disk: turns answered / refused (507)",
            f"{filled.turns_answered} / {filled.turns_refused}",
        ),
        ("full disk: blocks evicted for room", str(filled.blocks_evicted)),
        ("full disk: least free with a 20 MiB reserve (MiB)", f"{lowest_ours(filled):.1f}"),
        ("full disk: least free seen (MiB)", f"{lowest:.1f}"),
        ("full disk: free MiB, turn by turn", " ".join(f"{f:.0f}" for _, f in filled.free_mb)),
        ("full disk: space back to next answered turn", recovery),
    ]
    return filled.failures


def lowest_ours(filled: full_disk.Result) -> float:
    ours = [free for label, free in filled.free_mb if not label.startswith("others")]
    return min(ours, default=0.0)


if __name__ == "__main__":
    main()
