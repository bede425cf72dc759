"""Load through HAProxy across a local cluster: many agents' conversations at once.

    python -m reliability.cluster_load [--agents 24] [--turns 6] [--instances 3]

Each agent sends its turns one after another, naming itself in ``X-Agent-Id`` as a client
of a cluster does; all agents run at once. Checks: no 5xx, no transcript lost (every
acknowledged reply is in the agent's transcript, read back through the router), and how
the agents spread over the instances. A 409 ``agent_busy`` (the agent's lease is held by
another instance) is retried after its ``Retry-After``, as a client would, and counted.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from reliability.cluster import LocalCluster
from reliability.load import TOPICS

BUSY_RETRIES = 5


@dataclass
class ClusterLoadResult:
    requests: int = 0
    server_errors: int = 0
    client_errors: int = 0
    busy: int = 0
    transcripts_lost: int = 0
    seconds: float = 0.0
    served_by: Counter[str] = field(default_factory=Counter)
    away: int = 0
    """Requests answered elsewhere than their agent's usual instance (bounded load)."""
    failures: list[str] = field(default_factory=list)

    def merge(self, part: ClusterLoadResult) -> None:
        self.requests += part.requests
        self.server_errors += part.server_errors
        self.client_errors += part.client_errors
        self.busy += part.busy
        self.transcripts_lost += part.transcripts_lost
        self.served_by += part.served_by
        self.away += part.away
        self.failures += part.failures


def converse(url: str, agent: str, turns: int) -> ClusterLoadResult:
    """One agent's conversation through the router, counted on its own."""
    result = ClusterLoadResult()
    headers = {"X-Agent-Id": agent}
    with httpx.Client(base_url=url, timeout=600, headers=headers) as client:
        created = _sent(client, result, "/v1/agents", {"id": agent, "system_prompt": "Be brief."})
        if created is None or created.status_code != 201:
            result.failures.append(f"{agent}: not created")
            return result
        acknowledged = 0
        for turn in range(turns):
            topic = TOPICS[(sum(map(ord, agent)) + turn) % len(TOPICS)]
            body = {"content": f"Tell me one fact about {topic}.", "max_tokens": 16}
            reply = _sent(client, result, f"/v1/agents/{agent}/messages", body)
            if reply is not None and reply.status_code == 200:
                acknowledged += 1
        read = client.get(f"/v1/agents/{agent}/messages")
        if read.status_code != 200:
            result.transcripts_lost += acknowledged
            result.failures.append(f"{agent}: transcript {read.status_code} {read.text[:200]}")
            return result
        result.away = result.requests - max(result.served_by.values())
        transcript = read.json()["data"]
        if len(transcript) != 2 * acknowledged:
            result.transcripts_lost += max(0, acknowledged - len(transcript) // 2)
            result.failures.append(f"{agent}: {len(transcript)} messages, {acknowledged} replies")
    return result


def _sent(
    client: httpx.Client, result: ClusterLoadResult, path: str, body: dict[str, object]
) -> httpx.Response | None:
    """POST, retrying a 409 ``agent_busy`` after its ``Retry-After``; counts what came back."""
    for _ in range(BUSY_RETRIES):
        response = client.post(path, json=body)
        result.requests += 1
        result.served_by[response.headers.get("X-Semantic-Instance", "?")] += 1
        if response.status_code == 409 and "agent_busy" in response.text:
            result.busy += 1
            time.sleep(float(response.headers.get("Retry-After", "1")))
            continue
        if response.status_code >= 500:
            result.server_errors += 1
            result.failures.append(f"{path}: {response.status_code} {response.text[:200]}")
        elif response.status_code >= 400:
            result.client_errors += 1
            result.failures.append(f"{path}: {response.status_code} {response.text[:200]}")
        return response
    return None


def run_on(url: str, agents: int, turns: int, prefix: str = "load") -> ClusterLoadResult:
    """``agents`` conversations of ``turns`` turns at once, through the router at ``url``."""
    result = ClusterLoadResult()
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=agents) as pool:
        for part in pool.map(lambda i: converse(url, f"{prefix}-{i}", turns), range(agents)):
            result.merge(part)
    result.seconds = time.monotonic() - started
    return result


def run(agents: int, turns: int, workdir: Path, instances: int = 3) -> ClusterLoadResult:
    with LocalCluster(workdir / "cluster", instances) as cluster:
        return run_on(cluster.url, agents, turns)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--agents", type=int, default=24)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--instances", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = run(args.agents, args.turns, Path(tmp), args.instances)
    print(
        f"requests: {result.requests} in {result.seconds:.0f} s, 5xx: {result.server_errors}, "
        f"other 4xx: {result.client_errors}, 409 busy (retried): {result.busy}, "
        f"transcripts lost: {result.transcripts_lost}"
    )
    print("served by: " + ", ".join(f"{k} {v}" for k, v in sorted(result.served_by.items())))
    print(f"requests away from their agent's usual instance: {result.away}")
    for failure in result.failures[:20]:
        print("  " + failure)


if __name__ == "__main__":
    main()
