"""The dashboard in a real browser: Debian's Chromium, driven by Selenium, on a server with
an admin key and a tenant's key.

Two agents in two namespaces take two turns each, one is forked; the admin's page lists all
three with their cached shares, the fork's detail shows the blocks it shares, and the
tenant's page shows its own namespace only. The screenshot lands in the test's output
(``SEMANTIC_TEST_OUTPUT``, else pytest's temporary directory).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from reliability.server import ServerProcess

from semantic.adapters.cli.main import main

pytestmark = pytest.mark.model

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.chrome.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
SYSTEM = "You answer in one word. " + "Be brief. " * 120  # over one 256-token block
ADMIN = "admin-key"


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("needs Debian's chromium and chromium-driver (scripts/setup.sh installs them)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    options.add_argument("--window-size=1400,1700")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


@pytest.fixture
def served(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> Iterator[tuple[ServerProcess, str]]:
    keys_file = tmp_path / "keys"
    assert main(["keys", "add", "team-a", "--file", str(keys_file)]) == 0
    tenant_key = capsys.readouterr().out.strip()
    args = ("--api-keys-file", str(keys_file), "--data-dir", str(tmp_path / "data"))
    with ServerProcess(tmp_path / "logs", *args, env={"SEMANTIC_API_KEY": ADMIN}).start() as server:
        yield server, tenant_key


def _agent_with_two_turns(server: ServerProcess, headers: dict[str, str], agent: str) -> None:
    url = f"{server.url}/v1/agents"
    made = httpx.post(url, json={"id": agent, "system_prompt": SYSTEM}, headers=headers)
    assert made.status_code == 201, made.text
    for content in ("Hi", "And again?"):
        turn = {"content": content, "max_tokens": 1}
        sent = httpx.post(f"{url}/{agent}/messages", json=turn, headers=headers, timeout=120)
        assert sent.status_code == 200, sent.text


def _open(browser: WebDriver, server: ServerProcess, key: str) -> None:
    browser.get(f"{server.url}/dashboard")
    browser.execute_script("sessionStorage.clear()")
    browser.refresh()
    WebDriverWait(browser, 20).until(
        lambda b: b.execute_script("return !document.getElementById('key-form').hidden")
    )
    browser.find_element(By.ID, "key").send_keys(key)
    browser.find_element(By.CSS_SELECTOR, "#key-form button").click()
    WebDriverWait(browser, 20).until(
        lambda b: b.find_element(By.TAG_NAME, "body").get_attribute("data-loaded") == "true"
    )


def _rows(browser: WebDriver) -> dict[str, str]:
    """Listed agents (``namespace/id``) and their cached share as shown, read in one go:
    the page redraws its rows every few seconds, which would leave handles stale."""
    rows = browser.execute_script(
        "return [...document.querySelectorAll('#agents tbody tr')]"
        ".map(r => [r.dataset.agent, r.querySelector('.cached-share').textContent])"
    )
    return {str(agent): str(shown) for agent, shown in rows}


def _fact(browser: WebDriver, field: str) -> str:
    """A fact of the agent shown in detail ('' until it is drawn)."""
    found = browser.execute_script(
        "const e = document.querySelector(`#detail-facts [data-field='${arguments[0]}']`);"
        "return e ? e.textContent : ''",
        field,
    )
    return str(found)


def _click_row(browser: WebDriver, agent: str) -> None:
    """Click an agent's row, found again if a redraw replaced it meanwhile."""

    def clicked(b: WebDriver) -> bool:
        b.find_element(By.CSS_SELECTOR, f'tr[data-agent="{agent}"]').click()
        return True

    WebDriverWait(browser, 20, ignored_exceptions=(StaleElementReferenceException,)).until(clicked)


def _output(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("SEMANTIC_TEST_OUTPUT", tmp_path))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def test_the_dashboard_shows_agents_forks_and_tenants_in_a_browser(
    served: tuple[ServerProcess, str], browser: WebDriver, tmp_path: Path
) -> None:
    server, tenant_key = served
    tenant = {"Authorization": f"Bearer {tenant_key}"}
    _agent_with_two_turns(server, tenant, "planner")
    fork = httpx.post(
        f"{server.url}/v1/agents/planner/fork", json={"id": "planner-fork"}, headers=tenant
    )
    assert fork.status_code == 201, fork.text
    _agent_with_two_turns(server, {"x-api-key": ADMIN, "X-Namespace": "team-b"}, "scout")

    page = httpx.get(f"{server.url}/dashboard")  # the page holds no data: no key asked
    assert page.status_code == 200
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    assert httpx.get(f"{server.url}/v1/dashboard/agents").status_code == 401

    _open(browser, server, ADMIN)
    shown = _rows(browser)
    assert set(shown) == {"team-a/planner", "team-a/planner-fork", "team-b/scout"}
    for agent in ("team-a/planner", "team-b/scout"):  # the second turn began from the first's
        assert shown[agent].endswith("%"), shown
        assert shown[agent] != "0%", shown
    _click_row(browser, "team-a/planner-fork")
    WebDriverWait(browser, 20).until(lambda b: _fact(b, "shared_blocks") not in ("", "0"))
    assert int(_fact(browser, "shared_blocks")) >= 1
    assert _fact(browser, "forked_from") == "planner"
    assert browser.find_elements(By.CSS_SELECTOR, "#block-strip .block.shared")
    screenshot = _output(tmp_path) / "dashboard.png"
    assert browser.save_screenshot(str(screenshot))
    print(f"dashboard screenshot: {screenshot}")

    _open(browser, server, tenant_key)
    assert set(_rows(browser)) == {"team-a/planner", "team-a/planner-fork"}
    made = httpx.post(f"{server.url}/v1/agents", json={"id": "latecomer"}, headers=tenant)
    assert made.status_code == 201
    WebDriverWait(browser, 20).until(lambda b: "team-a/latecomer" in _rows(b))  # no reload
    assert "namespace team-a" in browser.find_element(By.ID, "server").text
    refused = [
        entry["message"]
        for entry in browser.get_log("browser")  # type: ignore[no-untyped-call]  # unannotated in selenium
        if "Content Security Policy" in entry["message"]
    ]
    assert not refused, refused
    elsewhere = httpx.get(
        f"{server.url}/v1/dashboard/agents", params={"namespace": "team-b"}, headers=tenant
    )
    assert elsewhere.status_code == 403, elsewhere.text  # not its own list in that one's place
    assert elsewhere.json()["error"]["code"] == "namespace_not_allowed"
    _usage_agrees_with_the_files(server, tenant, tmp_path / "data")


def _usage_agrees_with_the_files(
    server: ServerProcess, tenant: dict[str, str], data_dir: Path
) -> None:
    """A namespace's usage: its own key reads it, not another's; the namespaces' disk
    bytes together are the block files on disk, within one block, and each is its
    ``semantic_namespace_disk_bytes``."""
    own = httpx.get(f"{server.url}/v1/namespaces/team-a/usage", headers=tenant)
    assert own.status_code == 200, own.text
    assert httpx.get(f"{server.url}/v1/namespaces/team-b/usage", headers=tenant).status_code == 403
    admin = {"x-api-key": ADMIN}
    disk = [
        httpx.get(f"{server.url}/v1/namespaces/{ns}/usage", headers=admin).json()["disk"]
        for ns in ("team-a", "team-b")
    ]
    assert all(d["used_bytes"] > 0 and d["quota_bytes"] is None for d in disk)
    metrics = httpx.get(f"{server.url}/metrics", headers=admin).text
    gauged = {
        sample.labels["namespace"]: sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == "semantic_namespace_disk_bytes"
    }
    assert [gauged[ns] for ns in ("team-a", "team-b")] == [d["used_bytes"] for d in disk]
    files = [p.stat().st_size for p in (data_dir / "blocks").rglob("*.safetensors")]
    assert abs(sum(d["used_bytes"] for d in disk) - sum(files)) <= max(files)
