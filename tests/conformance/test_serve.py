"""``semantic serve --model DIR`` on a tiny model of each family answers over HTTP, through
the official OpenAI client: a reply, then the same conversation again, restored from the
first request's KV, with the same reply. The servers start together (each is its own
process, and most of a start is imports)."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from reliability.server import ServerProcess

from tests.conformance.conftest import ModelDirs
from tests.conformance.serving import device_choice, served_kv_dtype, words
from tests.conformance.tiny_models import FAMILIES, Variant

pytestmark = pytest.mark.model  # the embedded model's tokenizer

openai = pytest.importorskip("openai")  # the dev extra has it; a bare device install may not

SERVED = [
    Variant(family, quantized=bool(i & 2), dtype=("float32", "bfloat16")[i & 1])
    for i, family in enumerate(FAMILIES)
]
"""One row per family, the four kinds of row in turn."""


@pytest.fixture(scope="module")
def servers(
    model_dir: ModelDirs, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[Variant, Future[ServerProcess]]]:
    dirs = {variant: model_dir(variant) for variant in SERVED}
    root = tmp_path_factory.mktemp("served")
    args = ("--kv-budget-mb", "64", "--prefault-mb", "0", "--device", device_choice())
    processes = {
        v: ServerProcess(root / v.name, "--model", str(path), *args) for v, path in dirs.items()
    }
    with ThreadPoolExecutor(len(processes)) as pool:
        started = {v: pool.submit(p.start, 300.0) for v, p in processes.items()}
        try:
            yield started
        finally:
            for process in processes.values():
                process.kill()


@pytest.mark.parametrize("variant", SERVED, ids=lambda v: v.name)
def test_a_tiny_model_of_each_family_answers_over_http(
    variant: Variant, servers: dict[Variant, Future[ServerProcess]]
) -> None:
    server = servers[variant].result()
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list().data] == [variant.name]
    question = words(random.Random(variant.name), 300)
    replies = [
        client.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": question}],
            temperature=0,
            max_tokens=8,
            timeout=120,
        )
        for _ in range(2)
    ]
    first, again = replies
    assert first.usage is not None
    assert again.usage is not None
    assert first.choices[0].finish_reason in ("length", "stop")
    assert first.usage.completion_tokens > 0
    assert first.choices[0].message.content
    assert again.usage.prompt_tokens_details is not None
    assert again.usage.prompt_tokens_details.cached_tokens == first.usage.prompt_tokens - 1
    assert again.choices[0].message.content == first.choices[0].message.content


LLAMA_BODIED = {"llama", "llama3", "mistral", "qwen2", "qwen3"}


@pytest.mark.parametrize("variant", SERVED, ids=lambda v: v.name)
def test_each_served_model_says_which_fast_paths_run(
    variant: Variant, servers: dict[Variant, Future[ServerProcess]]
) -> None:
    """``GET /v1/models/{id}``, as the start's log lines say: slicing for every family
    (Gemma 3's and Phi-3's layers whole), riding (on the CPU) for every llama-bodied one,
    the host softmax for those in float32 (bfloat16 ones too on our products, ADR 0031),
    and every path that is off says why."""
    server = servers[variant].result()
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    said = (client.models.retrieve(variant.name).model_extra or {})["runtime"]["accelerations"]
    assert all(value.startswith(("on", "off: ")) for value in said.values())
    logged = server.log.read_text()
    for name, value in said.items():  # the same, one line each at start (or, for the huge
        # pages' move, when it ended: ADR 0032)
        assert f"acceleration {name}: {value}" in logged
    bodied = variant.family in LLAMA_BODIED
    assert said["long prompts sliced between decode steps (ADR 0009)"] == "on"
    if device_choice() == "cpu":  # on a GPU the host paths are off, and say so
        assert (said["prompt chunks ride decode steps (ADR 0009)"] == "on") == bodied
        host_softmax = bodied and served_kv_dtype(variant) == "float32"
        narrow = variant.quantized or variant.dtype == "bfloat16"
        products = said["bfloat16 and 4/8-bit products on our kernels (ADR 0031)"]
        assert (products == "on") == (narrow and served_kv_dtype(variant) == "float32")
        assert (said["host softmax attention (ADR 0008)"] == "on") == host_softmax
    if not bodied:
        assert variant.family in said["host pass for small passes (ADR 0013)"]


def test_a_model_type_mlx_lm_does_not_know_is_named_as_such(
    model_dir: ModelDirs, tmp_path: Path
) -> None:
    """Not "re-create it": no directory fixes an architecture the installed mlx-lm lacks."""
    unknown = tmp_path / "unknown"
    shutil.copytree(model_dir(Variant("llama", quantized=False, dtype="float32")), unknown)
    config = json.loads((unknown / "config.json").read_text())
    (unknown / "config.json").write_text(json.dumps({**config, "model_type": "foomodel"}))
    command = [sys.executable, "-m", "semantic", "generate", "hi", "--model", str(unknown)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 2
    assert "no model class for its config.json's model_type" in result.stderr
    assert "re-create" not in result.stderr


def test_a_model_without_a_chat_template_refuses_chats_by_name_and_completes_prompts(
    model_dir: ModelDirs, tmp_path: Path
) -> None:
    """A base model ships no chat template: its chat routes are a 400 saying so (not a
    500 from deep in transformers), and a raw prompt still completes."""
    base = tmp_path / "base"
    shutil.copytree(model_dir(Variant("llama", quantized=False, dtype="float32")), base)
    config = json.loads((base / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (base / "tokenizer_config.json").write_text(json.dumps(config))
    server = ServerProcess(tmp_path / "data", "--model", str(base), "--prefault-mb", "0").start()
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(
                model="default", messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
        assert "no chat template" in str(refused.value)
        assert refused.value.body["param"] == "messages"
        done = client.completions.create(model="default", prompt="Once upon", max_tokens=4)
        assert done.usage is not None
        assert done.usage.completion_tokens > 0
        assert "has no chat template" in server.log.read_text()
    finally:
        server.stop()
