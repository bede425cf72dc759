"""Isolation: ids that could escape a directory, tenants that could see each other's cache,
and routes that could be reached without the API key.

    python -m reliability.isolation
"""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx

from reliability.server import ServerProcess

BAD_IDS = [
    "..",
    "../x",
    "x/../y",
    "a..b",
    "%2e%2e%2f",
    "/",
    "a/b",
    "\\",
    "a\\b",
    "*",
    "a*",
    "?",
    "a?b",
    "agent\x01",
    "nul\x00byte",
    "tab\tid",
    "new\nline",
    "\u0430gent",  # Cyrillic 'а'
    "аdmin",
    "ag\u200bent",
    "x" * 129,
    "-leading-dash",
    ".hidden",
    "",
    " ",
    "a b",
    "é",
]
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
ROUTES = (
    "/v1/models",
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/agents",
    "/v1/agents/x",
    "/v1/agents/x/messages",
    "/v1/agents/x/fork",
    "/v1/agents/x/cache",
    "/metrics",
    "/schema/openapi.json",
    "/no/such/route",
)


@dataclass
class Result:
    tried: int = 0
    refused: int = 0
    failures: list[str] = field(default_factory=list)

    def expect(self, ok: bool, what: str) -> None:
        self.tried += 1
        self.refused += ok
        if not ok:
            self.failures.append(what)


def raw_request(server: ServerProcess, method: str, path: str, headers: dict[str, str]) -> int:
    """Send bytes as they are (httpx refuses control characters in headers)."""
    body = b'{"model":"default","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}'
    lines = [
        f"{method} {path} HTTP/1.1",
        f"Host: 127.0.0.1:{server.port}",
        "Connection: close",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
    ]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    payload = ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape") + body
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(payload)
        status_line = sock.makefile("rb").readline().decode("latin-1")
    parts = status_line.split()
    return int(parts[1]) if len(parts) > 1 else 0


def check_ids(server: ServerProcess, result: Result) -> None:
    control = raw_request(server, "POST", "/v1/chat/completions", {"X-Agent-Id": "good.id-1"})
    if control != 200:
        raise RuntimeError(f"a valid request was refused ({control}); the suite cannot tell")
    for bad in BAD_IDS:
        for header in ("X-Agent-Id", "X-Namespace"):
            status = raw_request(server, "POST", "/v1/chat/completions", {header: bad})
            result.expect(400 <= status < 500, f"{header}={bad!r} -> {status}")
        if not bad:
            continue  # /v1/agents/ is the list route
        quoted = httpx.URL(f"{server.url}/v1/agents/").copy_with(
            raw_path=b"/v1/agents/" + _quote(bad)
        )
        status = httpx.get(quoted).status_code
        result.expect(400 <= status < 500, f"path id {bad!r} -> {status}")
        status = httpx.post(f"{server.url}/v1/agents", json={"id": bad}).status_code
        result.expect(400 <= status < 500, f"body id {bad!r} -> {status}")


def check_namespaces(server: ServerProcess, result: Result) -> None:
    words = " ".join(f"word{i}" for i in range(200))  # 723 tokens: two whole blocks
    body = {
        "model": "default",
        "max_tokens": 1,
        "temperature": 0,
        "messages": [{"role": "user", "content": f"Repeat this: {words}"}],
    }
    first = httpx.post(
        f"{server.url}/v1/chat/completions",
        json=body,
        headers={"X-Namespace": "tenant-a"},
        timeout=300,
    ).json()
    second = httpx.post(
        f"{server.url}/v1/chat/completions",
        json=body,
        headers={"X-Namespace": "tenant-b"},
        timeout=300,
    ).json()
    again = httpx.post(
        f"{server.url}/v1/chat/completions",
        json=body,
        headers={"X-Namespace": "tenant-a"},
        timeout=300,
    ).json()
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    result.expect(cached == 0, f"tenant-b got {cached} cached tokens from tenant-a's prompt")
    hit = again["usage"]["prompt_tokens_details"]["cached_tokens"]
    result.expect(hit > 300, f"tenant-a's own repeat got only {hit} cached tokens")
    del first


def check_api_key(server: ServerProcess, result: Result, key: str) -> None:
    for route in ROUTES:
        for method in METHODS:
            for headers in (
                {},
                {"x-api-key": "wrong"},
                {"Authorization": "Bearer wrong"},
                {"Authorization": key},
            ):
                status = httpx.request(method, f"{server.url}{route}", headers=headers).status_code
                result.expect(status == 401, f"{method} {route} {headers} -> {status}")
    status = httpx.get(f"{server.url}/health").status_code
    result.expect(status == 200, f"/health without a key -> {status}")
    status = httpx.get(f"{server.url}/v1/models", headers={"x-api-key": key}).status_code
    result.expect(status == 200, f"the right key -> {status}")


def _quote(value: str) -> bytes:
    from urllib.parse import quote

    return quote(value, safe="%").encode() if value else b""


def run(workdir: object) -> Result:
    from pathlib import Path

    result = Result()
    base = Path(str(workdir))
    server = ServerProcess(base / "open")
    guarded = ServerProcess(base / "guarded", "--api-key", "k3y")
    try:
        with ThreadPoolExecutor(2) as starting:  # each loads the model: at once, not in turn
            list(starting.map(ServerProcess.start, (server, guarded)))
        check_ids(server, result)
        check_namespaces(server, result)
        check_api_key(guarded, result, "k3y")
    finally:
        server.kill()
        guarded.kill()
    return result


def main() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        result = run(tmp)
    print(f"isolation cases refused: {result.refused} of {result.tried}")
    for failure in result.failures[:30]:
        print("  " + failure)


if __name__ == "__main__":
    main()
