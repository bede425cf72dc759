"""Fuzzing: no input may cause a 5xx or a crash; every refusal is a 4xx with a message.

    python -m reliability.fuzz [--examples 40]

Two sources of input: schemathesis, from the OpenAPI schema the server serves (positive and
negative cases for every operation), and hypothesis-generated request bodies aimed at the
generation endpoints (wrong types, empty messages, absurd max_tokens, huge prompts, invalid
UTF-8, oversized bodies). The server runs with a small max-tokens cap so valid requests stay
short.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from hypothesis.reporting import with_reporter
from schemathesis.core.result import Err
from schemathesis.generation.modes import GenerationMode

from reliability.server import ServerProcess

ENDPOINTS = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/agents",
    "/v1/agents/fuzz/messages",
    "/v1/responses",
    "/v1/conversations",
)
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True)
    | st.text(max_size=50),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5)
    ),
    max_leaves=12,
)
MESSAGE = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "assistant", "system", "tool", "", "developer"]),
        "content": st.one_of(st.text(max_size=200), st.just(""), st.none(), JSON),
    }
)
NEAR_VALID = st.fixed_dictionaries(
    {
        "model": st.sampled_from(["default", "smollm2-135m-instruct", "", "other"]),
        "messages": st.lists(MESSAGE, max_size=3),
    },
    optional={
        "max_tokens": st.integers(-5, 10**12) | JSON,
        "temperature": st.floats() | JSON,
        "top_p": st.floats() | JSON,
        "stop": st.lists(st.text(max_size=5), max_size=20) | JSON,
        "stream": st.booleans() | JSON,
        "seed": st.integers(-(2**70), 2**70),
        "prompt": st.text(max_size=100) | JSON,
        "content": st.text(max_size=100) | JSON,
        "id": st.text(max_size=140),
        "system": JSON,
        "n": st.integers(0, 4),
    },
)


@dataclass
class FuzzResult:
    cases: int = 0
    server_errors: int = 0
    refusals_without_message: int = 0
    failures: list[str] = field(default_factory=list)

    def record(self, what: str, response: httpx.Response | Any) -> None:
        self.cases += 1
        status = response.status_code
        if status >= 500:
            self.server_errors += 1
            self.failures.append(f"{what} -> {status}: {response.text[:200]}")
        elif status >= 400 and status != 404 and not _says_why(response):
            self.refusals_without_message += 1
            self.failures.append(f"{what} -> {status} without an error message")


def _says_why(response: httpx.Response | Any) -> bool:
    """An error body with a message; a reply to HEAD has no body at all (RFC 9110), so its
    status is all it can say."""
    if response.request.method == "HEAD":
        return True
    return _has_message(response)


def _has_message(response: httpx.Response | Any) -> bool:
    try:
        body = response.json()
    except ValueError:
        return False
    error = body.get("error") if isinstance(body, dict) else None
    return isinstance(error, dict) and bool(error.get("message"))


def fuzz_schema(server: ServerProcess, examples: int, result: FuzzResult) -> None:
    schema = schemathesis.openapi.from_url(f"{server.url}/schema/openapi.json")
    for found in schema.get_all_operations():
        if isinstance(found, Err):
            raise found.err()  # our own schema does not parse: that is a bug to see
        operation = found.ok()
        for mode in _modes(operation):
            runner = _case_runner(
                server, operation.as_strategy(generation_mode=mode), str(mode), examples, result
            )
            try:
                with with_reporter(lambda _: None):  # refusals are counted, not printed
                    runner()
            except Unsatisfiable:
                continue  # nothing can violate this operation's schema (no parameters)


def _modes(operation: Any) -> tuple[GenerationMode, ...]:
    """Negative cases only where there is input to make wrong: hypothesis reports an
    operation without any as a failed (unsatisfiable) test, with a seed to reproduce it."""
    parts = (operation.path_parameters, operation.query, operation.headers, operation.body)
    if any(len(part) for part in parts):
        return (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    return (GenerationMode.POSITIVE,)


def _case_runner(
    server: ServerProcess, strategy: Any, mode: str, examples: int, result: FuzzResult
) -> Any:
    @settings(
        max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(case=strategy)
    def check(case: Any) -> None:
        response = case.call(base_url=server.url, timeout=120)
        result.record(f"{case.method} {case.formatted_path} ({mode})", response)

    return check


def fuzz_bodies(server: ServerProcess, examples: int, result: FuzzResult) -> None:
    with httpx.Client(base_url=server.url, timeout=120) as client:
        client.post("/v1/agents", json={"id": "fuzz"})

        @settings(
            max_examples=examples,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(path=st.sampled_from(ENDPOINTS), body=NEAR_VALID | JSON)
        def check(path: str, body: Any) -> None:
            content = json.dumps(body, allow_nan=True).encode()
            result.record(
                f"POST {path} {content[:80]!r}",
                client.post(path, content=content, headers={"content-type": "application/json"}),
            )

        check()
        specials = {
            "invalid utf-8": b'{"model": "default", "messages": [{"role": "user", '
            b'"content": "\xff\xfe"}]}',
            "not json": b"{this is not json",
            "empty body": b"",
            "oversized body": b'{"model": "default", "prompt": "' + b"x" * (5 << 20) + b'"}',
            "prompt over the context": json.dumps(
                {"model": "default", "prompt": "word " * 9000}
            ).encode(),
            "absurd max_tokens": json.dumps(
                {
                    "model": "default",
                    "max_tokens": 10**15,
                    "messages": [{"role": "user", "content": "hi"}],
                }
            ).encode(),
            "empty messages": json.dumps({"model": "default", "messages": []}).encode(),
        }
        for label, content in specials.items():
            for path in ENDPOINTS[:3]:
                response = client.post(
                    path, content=content, headers={"content-type": "application/json"}
                )
                result.record(f"{label} -> {path}", response)
                lowered = (label, path) == ("absurd max_tokens", "/v1/messages")  # a ceiling
                if (
                    response.status_code < 400
                    and label != "prompt over the context"
                    and not lowered
                ):
                    result.failures.append(
                        f"{label} -> {path} was accepted ({response.status_code})"
                    )


def run(examples: int, workdir: Path) -> FuzzResult:
    result = FuzzResult()
    server = ServerProcess(workdir / "fuzz", "--max-tokens-cap", "8", "--max-waiting", "64").start()
    try:
        fuzz_schema(server, examples, result)
        fuzz_bodies(server, examples * 5, result)
        alive = httpx.get(f"{server.url}/health").status_code == 200
        if not alive:
            result.failures.append("the server is not healthy after fuzzing")
    finally:
        server.kill()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--examples", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = run(args.examples, Path(tmp))
    print(
        f"fuzz cases tried: {result.cases}, 5xx found: {result.server_errors}, "
        f"refusals without a message: {result.refusals_without_message}"
    )
    for failure in result.failures[:20]:
        print("  " + failure)


if __name__ == "__main__":
    main()
