"""The cluster under faults (issue 49): agents run turns through HAProxy the whole time while a
seeded loop injects one fault after another (``reliability.faults``) and ends it.

    python -m reliability.cluster_faults [--faults 100] [--seed 7] [--agents 4] [--instances 2]

Faults: an instance SIGKILLed (and restarted) or SIGSTOPped past its lease (then continued),
Redis stopped or flushed, PostgreSQL restarted or every session on it cut, both stores' links
made slow (``SlowLink``), and, as root, an instance's disk filled by another program. Prints
turns acknowledged, lost, duplicated or forked; every non-200 answer by status and cause,
during a fault or not; time to recover per fault kind (until every instance is ready and a
turn through the router answers); and whether each agent's next turn after the last
recovery equals a cold answer token for token. Exits 1 if any check fails.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import httpx
from benchmarks.machine import machine

from reliability.cluster import LocalCluster, workdir_at
from reliability.faults import FAULTS, Fault
from reliability.full_disk import MountRefusedError, tmpfs
from reliability.shared_stores import SharedStores
from reliability.talkers import Talker, transcript_faults

LEASE_S = 3.0
RECOVERY_LIMIT_S = 120.0


def run(args: argparse.Namespace, workdir: Path) -> bool:
    rng = random.Random(args.seed)
    with contextlib.ExitStack() as stack:
        disks = _disks(stack, workdir, args.instances, args.disk_mb)
        faults = [f for f in FAULTS if f.kind != "disk-full" or disks]
        stores = SharedStores(workdir / "stores", LEASE_S, slow_links=True)
        cluster = stack.enter_context(LocalCluster(workdir, args.instances, stores=stores))
        print(f"cluster up: {args.instances} instances behind {cluster.url}", flush=True)
        talkers = [Talker(cluster.url, f"agent-{i}") for i in range(args.agents)]
        for talker in talkers:
            talker.start()
        recovered: dict[str, list[float]] = defaultdict(list)
        try:
            for number in range(1, args.faults + 1):
                fault = rng.choice(faults)
                recovered[fault.kind].append(_inject(cluster, fault, rng, talkers))
                for talker in talkers:
                    talker.fault = None
                print(
                    f"fault {number}/{args.faults}: {fault.kind}, "
                    f"recovered in {recovered[fault.kind][-1]:.1f} s",
                    flush=True,
                )
                time.sleep(args.gap_s)
        finally:
            for talker in talkers:
                talker.finish()
        return _report(cluster, talkers, recovered)


def _inject(
    cluster: LocalCluster, fault: Fault, rng: random.Random, talkers: list[Talker]
) -> float:
    """The fault, held, then ended; seconds from its end (the restart, the continue, the
    store back) until every instance is ready and a turn through the router answers."""
    for talker in talkers:
        talker.fault = fault.kind
    recover = fault.inject(cluster, rng)
    time.sleep(LEASE_S + 1.0 if fault.kind == "pause" else fault.hold_s)
    for talker in talkers:
        talker.fault = f"{fault.kind} (recovering)"
    started = time.monotonic()
    recover()
    _recovered(cluster, started + RECOVERY_LIMIT_S)
    return time.monotonic() - started


def _recovered(cluster: LocalCluster, deadline: float) -> None:
    with httpx.Client(timeout=30) as client:
        while time.monotonic() < deadline:
            ready = all(_ready(client, server.url) for server in cluster.servers)
            if ready and _answers(client, cluster.url):
                return
            time.sleep(0.2)
    raise TimeoutError(f"the cluster did not recover within {RECOVERY_LIMIT_S:.0f} s")


def _ready(client: httpx.Client, url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return client.get(f"{url}/ready").status_code == 200
    return False


def _answers(client: httpx.Client, url: str) -> bool:
    body = {"model": "default", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    with contextlib.suppress(httpx.HTTPError):
        return client.post(f"{url}/v1/chat/completions", json=body).status_code == 200
    return False


def _report(
    cluster: LocalCluster, talkers: list[Talker], recovered: dict[str, list[float]]
) -> bool:
    print(f"\nmachine: {machine()}")
    answers = Counter[str]()
    for talker in talkers:
        answers.update(talker.tally())
    acknowledged = sum(t.acknowledged for t in talkers)
    found = Counter[str]()
    with httpx.Client(base_url=cluster.url, timeout=120) as client:
        for talker in talkers:
            found.update(transcript_faults(client, talker))
        cold_equal = sum(talker.matches_cold(client) for talker in talkers)
    print(f"turns sent {sum(answers.values())}, acknowledged {acknowledged}")
    for what in ("lost", "duplicated", "forked", "half"):
        print(f"  {what}: {found[what]}")
    print("answers by status and cause (during which fault):")
    for key, count in sorted(answers.items()):
        print(f"  {count:5d}  {key}")
    examples = {k: v for talker in talkers for k, v in talker.examples.items()}
    print("what each kind of refusal said (its first):")
    for key, said in sorted(examples.items()):
        print(f"  {key}: {said}")
    print("time to recover, per fault kind (median / max, seconds):")
    for kind, seconds in sorted(recovered.items()):
        median, worst = statistics.median(seconds), max(seconds)
        print(f"  {kind:17s} x{len(seconds):3d}  {median:6.1f} / {worst:6.1f}")
    print(f"next turn after recovery equal to a cold answer: {cold_equal} of {len(talkers)} agents")
    dropped = sum(n for k, n in answers.items() if k.startswith("no answer"))
    print(f"connections closed without an answer (a client library retries these): {dropped}")
    allowed = ("2", "503 with Retry-After", "409", "no answer")
    bad = [k for k in answers if not k.startswith(allowed)]
    passed = not bad and not any(found.values()) and cold_equal == len(talkers)
    print("PASS" if passed else f"FAIL: {', '.join(bad) or 'transcripts or cold answers'}")
    return passed


def _disks(stack: contextlib.ExitStack, workdir: Path, instances: int, size_mb: int) -> bool:
    """Each instance's data directory on a tmpfs of its own, where this may mount (root)."""
    try:
        for index in range(instances):
            stack.enter_context(tmpfs(workdir / f"instance-{index + 1}", size_mb))
    except MountRefusedError as refused:
        print(f"disk-full faults left out: no tmpfs could be mounted ({refused})")
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--faults", type=int, default=100)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument("--gap-s", type=float, default=1.0, help="quiet time between faults")
    parser.add_argument("--disk-mb", type=int, default=512, help="each instance's tmpfs")
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args()
    with workdir_at(args.workdir, "semantic-faults-") as workdir:
        sys.exit(0 if run(args, workdir) else 1)


if __name__ == "__main__":
    main()
