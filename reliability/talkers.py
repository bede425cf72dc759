"""Agents talking through a cluster's router while faults come and go (``cluster_faults``):
each a thread sending one turn after another, every answer counted by status and cause, and
afterwards its transcripts checked against what it was told was kept."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx

TURNS_PER_AGENT = 40
"""Then the talker moves on to a new agent: ~1,000 tokens each, well inside the window."""
BUSY_RETRIES = 30


@dataclass
class Agent:
    agent_id: str
    sent: list[str] = field(default_factory=list)
    acknowledged: list[str] = field(default_factory=list)


class Talker:
    """One client's agents, one after another (``TURNS_PER_AGENT`` turns each)."""

    def __init__(self, url: str, name: str) -> None:
        self.url = url
        self.name = name
        self.fault: str | None = None
        """The fault under way (set by the loop), to count each answer under."""
        self.agents: list[Agent] = []
        self._answers: Counter[str] = Counter()
        self.examples: dict[str, str] = {}
        """The first message of each kind of answer counted, to say what it was."""
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def acknowledged(self) -> int:
        return sum(len(agent.acknowledged) for agent in self.agents)

    def start(self) -> None:
        self._thread.start()

    def finish(self) -> None:
        self._done.set()
        self._thread.join()

    def tally(self) -> Counter[str]:
        return Counter(self._answers)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=300) as client:
            while not self._done.is_set():
                agent = Agent(f"{self.name}-{len(self.agents)}")
                if not self._made(client, agent):
                    continue
                self.agents.append(agent)
                for turn in range(TURNS_PER_AGENT):
                    if self._done.is_set():
                        return
                    self._turn(client, agent, f"{agent.agent_id} turn {turn}: name one colour.")

    def _made(self, client: httpx.Client, agent: Agent) -> bool:
        made = self._post(client, agent.agent_id, "/v1/agents", {"id": agent.agent_id})
        if made is not None and made.status_code == 409 and "exists" in made.text:
            return True  # made before its answer was lost
        return made is not None and made.status_code == 201

    def _turn(self, client: httpx.Client, agent: Agent, content: str) -> None:
        agent.sent.append(content)
        body = {"content": content, "max_tokens": 6}
        reply = self._post(client, agent.agent_id, f"/v1/agents/{agent.agent_id}/messages", body)
        if reply is not None and reply.status_code == 200:
            agent.acknowledged.append(content)

    def _post(
        self, client: httpx.Client, agent_id: str, path: str, body: dict[str, object]
    ) -> httpx.Response | None:
        """POST, retrying a 409 ``agent_busy`` after its Retry-After (nothing was done);
        every answer counted. None: no answer (the connection failed)."""
        for _ in range(BUSY_RETRIES):
            sent_during = self.fault or "no fault"
            try:
                reply = client.post(path, json=body, headers={"X-Agent-Id": agent_id})
            except httpx.HTTPError as error:
                fault = self._span(sent_during)
                key = f"no answer: {type(error).__name__} ({fault})"
                self._answers[key] += 1
                self.examples.setdefault(key, f"{time.strftime('%X')} {error}")
                time.sleep(0.5)
                return None
            key = _named(reply, self._span(sent_during))
            self._answers[key] += 1
            if reply.status_code >= 300:
                self.examples.setdefault(key, f"{time.strftime('%X')} {reply.text[:300]}")
            if reply.status_code == 409 and "agent_busy" in reply.text:
                time.sleep(min(float(reply.headers.get("Retry-After", "1")), 2.0))
                continue
            if reply.status_code >= 500:
                time.sleep(min(float(reply.headers.get("Retry-After", "1")), 1.0))
            return reply
        return None

    def _span(self, sent_during: str) -> str:
        """The fault a request was sent during, and the one it was answered during if
        another (a turn waiting for a lease may outlast a fault)."""
        answered_during = self.fault or "no fault"
        return (
            sent_during if answered_during == sent_during else f"{sent_during} -> {answered_during}"
        )

    def matches_cold(self, client: httpx.Client) -> bool:
        """The last agent's next turn equals a cold answer to the same conversation (another
        namespace, nothing cached there), token for token."""
        agent = self.agents[-1]
        history = _messages(client, agent.agent_id)
        question = f"After the faults, {agent.agent_id}: name one colour."
        turn = {"content": question, "max_tokens": 8}
        path = f"/v1/agents/{agent.agent_id}/messages"
        warm = self._post(client, agent.agent_id, path, turn)
        ask = [{"role": m["role"], "content": m["content"]} for m in history]
        cold = client.post(
            "/v1/chat/completions",
            json={
                "model": "default",
                "messages": [*ask, {"role": "user", "content": question}],
                "max_tokens": 8,
                "temperature": 0,
            },
            headers={"X-Namespace": f"cold-{agent.agent_id}"},
        )
        if warm is None or warm.status_code != 200 or cold.status_code != 200:
            return False
        return bool(warm.json()["content"] == cold.json()["choices"][0]["message"]["content"])


def transcript_faults(client: httpx.Client, talker: Talker) -> Counter[str]:
    """Each of the talker's transcripts against what it sent and was told was kept: an
    acknowledged turn missing (lost), a turn there twice (duplicated), one it never sent
    (forked: another writer's), or a question without its reply (half)."""
    found: Counter[str] = Counter()
    for agent in talker.agents:
        kept = _messages(client, agent.agent_id)
        roles = [m["role"] for m in kept]
        whole = len(kept) % 2 == 0 and roles == ["user", "assistant"] * (len(kept) // 2)
        found["half"] += 0 if whole else 1
        asked = [m["content"] for m in kept if m["role"] == "user"]
        found["duplicated"] += len(asked) - len(set(asked))
        found["forked"] += len(set(asked) - set(agent.sent))
        found["lost"] += len(set(agent.acknowledged) - set(asked))
    return found


def _messages(client: httpx.Client, agent_id: str) -> list[dict[str, str]]:
    for _ in range(30):  # a fault may still be settling: a 503 is retried
        read = client.get(f"/v1/agents/{agent_id}/messages", headers={"X-Agent-Id": agent_id})
        if read.status_code == 200:
            return list(read.json()["data"])
        time.sleep(1)
    raise RuntimeError(f"{agent_id}'s transcript could not be read: {read.status_code}")


def _named(reply: httpx.Response, fault: str) -> str:
    """``status[ with Retry-After] [error type] (fault)``: how answers are counted."""
    if reply.status_code < 300:
        return f"{reply.status_code} ({fault})"
    retry = " with Retry-After" if "Retry-After" in reply.headers else ""
    try:
        cause = reply.json()["error"].get("type") or reply.json()["error"].get("code")
    except (ValueError, KeyError, TypeError, AttributeError):
        cause = reply.text[:60].replace("\n", " ")
    return f"{reply.status_code}{retry} {cause} ({fault})"
