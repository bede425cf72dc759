"""A local server under attack from web pages and other tenants, and its files on disk.

A page on another site sends "simple" requests (plain text, a form, multipart: no
preflight), a DNS-rebinding page reads with a Host of its own name; both are refused while
SDKs (no Origin) and the server's own origin keep working. A key bound to a namespace
works there only. What the server writes is its user's alone.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from reliability.server import ServerProcess

from semantic.adapters.cli.main import main

pytestmark = pytest.mark.model

EVIL = {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}


def test_cross_site_requests_and_rebinding_hosts_are_refused(server: ServerProcess) -> None:
    agents = f"{server.url}/v1/agents"
    simple = {
        "text/plain;charset=UTF-8": json.dumps({"id": "victim-of-a-page"}),
        "application/x-www-form-urlencoded": "id=victim-of-a-page",
    }
    for content_type, content in simple.items():
        headers = {**EVIL, "Content-Type": content_type}
        planted = httpx.post(agents, content=content, headers=headers)
        assert planted.status_code == 403, content_type
        assert planted.json()["error"]["code"] == "origin_not_allowed"
        turn = httpx.post(f"{agents}/victim/messages", content=content, headers=headers)
        assert turn.status_code == 403
        anthropic_shaped = httpx.post(f"{server.url}/v1/messages", content=content, headers=headers)
        assert anthropic_shaped.status_code == 403
        assert anthropic_shaped.json()["error"]["type"] == "permission_error"
    multipart = httpx.post(agents, files={"id": (None, "victim-of-a-page")}, headers=EVIL)
    assert multipart.status_code == 403
    no_origin = httpx.post(agents, content=simple["text/plain;charset=UTF-8"])
    assert no_origin.status_code == 415  # whoever sends it: JSON routes take JSON only
    assert httpx.get(f"{agents}/victim-of-a-page").status_code == 404
    rebound = {"Host": f"rebind.attacker.example:{server.port}"}
    read = httpx.get(f"{agents}/victim/messages", headers=rebound)
    assert read.status_code == 421
    assert read.json()["error"]["code"] == "host_not_allowed"
    assert httpx.get(agents, headers={"Host": f"localhost:{server.port}"}).status_code == 200


def test_sdks_and_the_servers_own_origin_keep_working(server: ServerProcess) -> None:
    own = {"Origin": server.url, "X-Namespace": "own-origin"}
    made = httpx.post(f"{server.url}/v1/agents", json={"id": "page-agent"}, headers=own)
    assert made.status_code == 201, made.text
    turn = {"content": "Hi", "max_tokens": 1}
    reply = httpx.post(
        f"{server.url}/v1/agents/page-agent/messages", json=turn, headers=own, timeout=120
    )
    assert reply.status_code == 200, reply.text
    sdk = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    answer = sdk.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Hi"}], max_tokens=1
    )
    assert answer.usage is not None
    assert answer.usage.completion_tokens == 1


def assert_private(data_dir: Path) -> list[str]:
    """Every directory 0700, every file 0600 or less; the names seen."""
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    for path in data_dir.rglob("*"):
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == 0o700 if path.is_dir() else not mode & 0o077, (path, oct(mode))
    return [path.name for path in data_dir.rglob("*")]


def test_keys_bound_to_namespaces_and_private_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keys_file = tmp_path / "keys"
    assert main(["keys", "add", "team-a", "--file", str(keys_file)]) == 0
    key = capsys.readouterr().out.strip()
    keys_file.write_text(keys_file.read_text().strip() + " disk_mb=512\n")  # its quota too
    data_dir = tmp_path / "private" / "data"  # made by the server
    env = {"SEMANTIC_API_KEY": "admin-key", "SEMANTIC_ALLOWED_HOSTS": "semantic.lan, other.lan"}
    args = ("--api-keys-file", str(keys_file), "--data-dir", str(data_dir))
    with ServerProcess(tmp_path / "logs", *args, env=env).start() as server:
        tenant = openai.OpenAI(base_url=f"{server.url}/v1", api_key=key)
        system = "You answer in one word. " + "Be brief. " * 120  # over one 256-token block
        agent = {"id": "notes", "system_prompt": system}
        made = tenant.post("/agents", body=agent, cast_to=httpx.Response)
        assert made.json()["namespace"] == "team-a"  # no X-Namespace: the key's own
        tenant.post(
            "/agents/notes/messages",
            body={"content": "Hi", "max_tokens": 1},
            cast_to=httpx.Response,
        )
        elsewhere = tenant.with_options(default_headers={"X-Namespace": "team-b"})
        with pytest.raises(openai.PermissionDeniedError, match="bound to the namespace 'team-a'"):
            elsewhere.models.list()
        with pytest.raises(openai.PermissionDeniedError):
            tenant.post("/agents", body={"id": "x", "namespace": "team-b"}, cast_to=httpx.Response)
        claude = anthropic.Anthropic(
            base_url=server.url, api_key=key, default_headers={"X-Namespace": "team-b"}
        )
        with pytest.raises(anthropic.PermissionDeniedError):
            claude.messages.create(
                model="default", max_tokens=1, messages=[{"role": "user", "content": "Hi"}]
            )
        admin = {"x-api-key": "admin-key", "Host": f"semantic.lan:{server.port}"}
        in_a = httpx.get(
            f"{server.url}/v1/agents/notes", headers={**admin, "X-Namespace": "team-a"}
        )
        assert in_a.status_code == 200
        in_b = httpx.get(
            f"{server.url}/v1/agents/notes", headers={**admin, "X-Namespace": "team-b"}
        )
        assert in_b.status_code == 404
        assert httpx.get(f"{server.url}/v1/models").status_code == 401
        usage = httpx.get(
            f"{server.url}/v1/namespaces/team-a/usage", headers={"Authorization": f"Bearer {key}"}
        )
        assert usage.json()["disk"]["quota_bytes"] == 512 << 20, usage.text
        as_tenant = {"Authorization": f"Bearer {key}"}
        every_namespace = httpx.get(f"{server.url}/metrics", headers=as_tenant)
        assert every_namespace.status_code == 403
        assert every_namespace.json()["error"]["code"] == "admin_key_needed"
        scraped = httpx.get(f"{server.url}/metrics", headers=admin).text
        refused = 'semantic_requests_refused_total{code="invalid_api_key",status="401"}'
        assert f"{refused} 1.0" in scraped  # refused at the edge, counted all the same
        names = assert_private(data_dir)
        assert {"semantic.db", "semantic.db-wal", "lock"} <= set(names)
        assert server.stop() == 0  # flushes every save
    assert any(name.endswith(".safetensors") for name in assert_private(data_dir))
