"""The edge's browser checks and namespace-bound keys, driven as ASGI without a server:
what a page on another site or a rebinding name sends is refused, in the route's error
shape, before any route runs; what an SDK or the server's own page sends passes."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from semantic.adapters.cli.main import main
from semantic.adapters.cli.privacy import keep_private
from semantic.adapters.http.auth import edge
from semantic.adapters.http.browser import host_name
from semantic.adapters.http.identity import BOUND_NAMESPACE
from semantic.adapters.http.keys import (
    Grant,
    KeyRing,
    KeysFileError,
    hash_line,
    key_quotas,
    keyring,
    read_keys_file,
)

PAGE = "http://localhost:3000"


class Reached:
    """The app behind the edge: records the scope of each request that got through."""

    def __init__(self) -> None:
        self.scopes: list[dict[str, Any]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.scopes.append(scope)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}", "more_body": False})


def call(
    guarded: Any, method: str, path: str, headers: dict[str, str]
) -> tuple[int, dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "scheme": "http",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
    }
    asyncio.run(guarded(scope, receive, send))
    body = json.loads(sent[1]["body"]) if sent[1]["body"] != b"{}" else {}
    return sent[0]["status"], body


REFUSED: list[tuple[int, str]] = []
"""What the edges ``guard`` builds told the metrics, as (status, code)."""


def guard(keys: KeyRing | None = None, **options: Any) -> tuple[Any, Reached]:
    inner = Reached()
    return edge(inner, keys or KeyRing(), on_refused=_counted, **options), inner


def _counted(status: int, code: str) -> None:
    REFUSED.append((status, code))


def test_every_refusal_at_the_edge_is_counted(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys"
    keys_file.write_text(f"{hash_line('team-a', 'ka')}\n")
    guarded, _ = guard(keyring("root", keys_file), cors_origins=(PAGE,))
    REFUSED.clear()
    tenant = {**HOST, "Authorization": "Bearer ka"}
    asked = [
        ("GET", "/v1/agents", HOST),
        ("GET", "/v1/agents", {**tenant, "X-Namespace": "team-b"}),
        ("GET", "/v1/agents", {**tenant, "Origin": "http://evil.example"}),
        ("POST", "/v1/agents", {**tenant, "Content-Type": "text/plain", "Content-Length": "2"}),
        ("GET", "/v1/agents", {**tenant, "Host": "evil.example"}),
        ("GET", "/v1/agents/..%2Fx", tenant),
        ("GET", "/v1/agents", tenant),
    ]
    statuses = [call(guarded, method, path, headers)[0] for method, path, headers in asked]
    assert statuses == [401, 403, 403, 415, 421, 400, 200]
    assert [status for status, _ in REFUSED] == statuses[:-1]
    assert REFUSED[1] == (403, "namespace_not_allowed")


HOST = {"Host": "127.0.0.1:8000"}
JSON = {**HOST, "Content-Type": "application/json", "Content-Length": "2"}


@pytest.mark.parametrize(
    ("content_type", "status"),
    [
        ("text/plain;charset=UTF-8", 415),
        ("application/x-www-form-urlencoded", 415),
        ("multipart/form-data; boundary=x", 415),
        ("application/json; charset=utf-8", 200),
        ("application/merge-patch+json", 200),
    ],
)
def test_a_body_must_be_json_whoever_sends_it(content_type: str, status: int) -> None:
    guarded, _ = guard()
    headers = {**JSON, "Content-Type": content_type}
    assert call(guarded, "POST", "/v1/agents", headers)[0] == status


def test_a_body_without_a_content_type_is_refused_but_no_body_passes() -> None:
    guarded, _ = guard()
    code, body = call(guarded, "POST", "/v1/agents", {**HOST, "Content-Length": "5"})
    assert (code, body["error"]["code"]) == (415, "unsupported_media_type")
    assert "application/json" in body["error"]["message"]
    assert call(guarded, "POST", "/v1/agents/a/fork", HOST)[0] == 200


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded"])
def test_a_cross_site_request_is_refused_in_the_routes_shape(content_type: str) -> None:
    guarded, inner = guard(cors_origins=(PAGE,))
    evil = {**JSON, "Content-Type": content_type, "Origin": "http://evil.example"}
    code, body = call(guarded, "POST", "/v1/agents", evil)
    assert (code, body["error"]["code"]) == (403, "origin_not_allowed")
    assert "--cors-origin http://evil.example" in body["error"]["message"]
    code, body = call(guarded, "POST", "/v1/messages", evil)
    assert (code, body["type"], body["error"]["type"]) == (403, "error", "permission_error")
    code, _ = call(guarded, "GET", "/v1/agents/victim/messages", {**HOST, "Origin": "null"})
    assert code == 403
    hidden = {**HOST, "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"}
    assert call(guarded, "GET", "/v1/agents/victim/messages", hidden)[0] == 403
    assert inner.scopes == []


def test_the_servers_own_pages_allowed_origins_and_sdks_pass() -> None:
    guarded, inner = guard(cors_origins=(PAGE + "/",))
    assert (
        call(guarded, "POST", "/v1/agents", {**JSON, "Origin": "http://127.0.0.1:8000"})[0] == 200
    )
    assert call(guarded, "POST", "/v1/agents", {**JSON, "Origin": PAGE})[0] == 200
    assert call(guarded, "POST", "/v1/agents", JSON)[0] == 200
    other_port = {**JSON, "Origin": "http://127.0.0.1:9999"}  # another server's page
    assert call(guarded, "POST", "/v1/agents", other_port)[0] == 403
    assert len(inner.scopes) == 3


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("localhost", 200),
        ("localhost:8000", 200),
        ("LOCALHOST.:8000", 200),
        ("127.0.0.1:8000", 200),
        ("[::1]:8000", 200),
        ("192.168.1.20:8000", 200),  # an address cannot be rebound
        ("[fe80::1]", 200),
        ("semantic.lan:8000", 200),  # named with --allowed-host
        ("box.internal", 200),  # the bound name
        ("rebind.attacker.example:8000", 421),
        ("localhost.attacker.example", 421),
        ("semantic.lan:http", 421),
        ("[::1", 421),
    ],
)
def test_the_host_must_be_a_name_the_server_is_reached_by(host: str, status: int) -> None:
    guarded, _ = guard(allowed_hosts=("box.internal", "semantic.lan:443"))
    code, body = call(guarded, "GET", "/v1/agents", {"Host": host})
    assert code == status
    if status == 421:
        assert body["error"]["code"] == "host_not_allowed"
        assert "DNS rebinding" in body["error"]["message"]


def test_any_host_when_told_so() -> None:
    guarded, _ = guard(allowed_hosts=("*",))
    assert call(guarded, "GET", "/v1/agents", {"Host": "anything.example"})[0] == 200


def test_host_names_are_read_as_a_browser_writes_them() -> None:
    assert host_name(b"[::1]:80") == "::1"
    assert host_name(b"Example.COM.:8080") == "example.com"
    assert host_name(b"::1") == "::1"
    assert host_name(b"a:b") is None


def test_a_key_bound_to_a_namespace_opens_that_one_only(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys"
    keys_file.write_text(f"# tenants\n{hash_line('team-a', 'ka')}  # Ann\n")
    guarded, inner = guard(keyring("root", keys_file))
    tenant = {**HOST, "Authorization": "Bearer ka"}
    assert call(guarded, "GET", "/v1/agents", tenant)[0] == 200
    assert (b"x-namespace", b"team-a") in inner.scopes[-1]["headers"]
    assert inner.scopes[-1]["state"][BOUND_NAMESPACE] == "team-a"
    assert call(guarded, "GET", "/v1/agents", {**tenant, "X-Namespace": "team-a"})[0] == 200
    code, body = call(guarded, "GET", "/v1/agents", {**tenant, "X-Namespace": "team-b"})
    assert (code, body["error"]["code"]) == (403, "namespace_not_allowed")
    assert "bound to the namespace 'team-a'" in body["error"]["message"]
    code, body = call(
        guarded, "POST", "/v1/messages", {**JSON, "x-api-key": "ka", "X-Namespace": "b"}
    )
    assert (code, body["error"]["type"]) == (403, "permission_error")
    admin = {**HOST, "x-api-key": "root", "X-Namespace": "team-b"}
    assert call(guarded, "GET", "/v1/agents", admin)[0] == 200
    assert BOUND_NAMESPACE not in inner.scopes[-1].get("state", {})
    assert call(guarded, "GET", "/v1/agents", {**HOST, "x-api-key": "kb"})[0] == 401
    assert call(guarded, "GET", "/health", HOST)[0] == 200


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("team-a 1234\n", "line 1: expected `NAMESPACE sha256:HEX`"),
        ("\n" + "../x sha256:" + "0" * 64, "line 2: invalid namespace '../x'"),
        ("# nothing\n", "holds no key"),
        ("a sha256:" + "0" * 64 + "\nb sha256:" + "0" * 64, "line 2: this key is bound to two"),
        ("a sha256:" + "0" * 64 + " disk=9", "line 1: 'disk=9' is not a quota"),
        ("a sha256:" + "0" * 64 + " disk_mb=lots", "line 1: 'disk_mb=lots' is not a quota"),
        ("* sha256:" + "0" * 64 + " disk_mb=9", "line 1: an admin key"),
    ],
)
def test_a_bad_keys_file_is_refused_naming_the_line(
    tmp_path: Path, text: str, message: str
) -> None:
    keys_file = tmp_path / "keys"
    keys_file.write_text(text)
    with pytest.raises(KeysFileError, match=message.replace("(", r"\(")):
        read_keys_file(keys_file)


def test_a_keys_line_may_give_its_namespace_quotas_once(tmp_path: Path) -> None:
    """``team-a sha256:... disk_mb=4096``: the same limits ``--namespace-quotas`` takes."""
    keys_file = tmp_path / "keys"
    one, two = hash_line("team-a", "k1"), hash_line("team-a", "k2")
    keys_file.write_text(f"{one} memory_mb=64 disk_mb=512\n{two}\n{hash_line('*', 'root')}\n")
    assert key_quotas(keys_file) == {"team-a": {"memory_mb": 64.0, "disk_mb": 512.0}}
    assert len(read_keys_file(keys_file)) == 3
    keys_file.write_text(f"{one} disk_mb=512\n{two} disk_mb=256\n")
    with pytest.raises(KeysFileError, match="line 2: namespace 'team-a' is given two quotas"):
        key_quotas(keys_file)


def test_keys_add_appends_a_hash_and_prints_the_key_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    keys_file = tmp_path / "keys"
    assert main(["keys", "add", "team-a", "--file", str(keys_file)]) == 0
    key = capsys.readouterr().out.strip()
    monkeypatch.setenv("SEMANTIC_API_KEYS_FILE", str(keys_file))
    assert main(["keys", "add", "*"]) == 0
    admin = capsys.readouterr().out.strip()
    stored = keys_file.read_text()
    assert key not in stored
    assert admin not in stored
    assert keys_file.stat().st_mode & 0o777 == 0o600
    ring = keyring(None, keys_file)
    assert ring.grant_for(key.encode()) == Grant("team-a")
    assert ring.grant_for(admin.encode()) == Grant(None)
    assert ring.grant_for(b"sk-semantic-guess") is None
    monkeypatch.setattr("sys.stdin", io.StringIO(key + "\n"))
    assert main(["keys", "hash", "team-a"]) == 0
    assert capsys.readouterr().out.strip() in keys_file.read_text()


def test_serve_refuses_a_bad_keys_file_before_creating_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = tmp_path / "data"
    argv = ["serve", "--api-keys-file", str(tmp_path / "none"), "--data-dir", str(data_dir)]
    assert main(argv) == 2
    assert "cannot read the API keys file" in capsys.readouterr().err
    assert not data_dir.exists()


def test_a_data_directory_open_to_others_is_warned_of(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    before = os.umask(0o022)
    try:
        with caplog.at_level(logging.WARNING):
            keep_private(shared)
            made = tmp_path / "made"
            made.write_text("x")
        assert os.umask(0o022) == 0o077
    finally:
        os.umask(before)
    assert made.stat().st_mode & 0o777 == 0o600
    assert "open to other users (mode 755)" in caplog.text
    assert f"chmod 700 {shared}" in caplog.text
