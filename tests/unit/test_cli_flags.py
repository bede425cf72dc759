"""Every option that makes no sense is a usage error naming it: exit 2, one line, no
traceback, and nothing created or loaded first."""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

import pytest

from semantic.adapters.cli.main import _parser, main
from semantic.domain.errors import InvalidRequestError


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(list(argv))
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--port", "99999", "must be a port from 1 to 65535, not 99999"),
        ("--port", "0", "must be a port from 1 to 65535"),
        ("--port", "http", "not a whole number: 'http'"),
        ("--max-tokens-cap", "0", "must be positive, not 0"),
        ("--kv-budget-mb", "-5", "must be positive, not -5"),
        ("--max-waiting", "0", "must be positive"),
        ("--grace", "-1", "must be 0 or more, not -1"),
        ("--grace", "inf", "must be a finite number"),
        ("--disk-quota-mb", "0", "must be positive"),
        ("--prefault-mb", "-1", "must be 0 or more"),
        ("--prefault-mb", "999999", "must be at most the KV budget (--kv-budget-mb 2048)"),
        ("--prefill-budget", "0", "must be positive"),
        ("--prefill-ride", "nan", "must be a finite number"),
        ("--prefill-slice", "-2", "must be 0 or more"),
        ("--api-key", "", "must not be empty"),
        ("--model", "", "must not be empty"),
        ("--lease-seconds", "0", "must be positive"),
        ("--lease-wait", "-1", "must be 0 or more"),
        ("--max-context", "10", "must be at least 256 (one KV block), not 10"),
    ],
)
def test_serve_refuses_a_bad_flag_before_creating_anything(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, flag: str, value: str, message: str
) -> None:
    data_dir = tmp_path / "data"
    line = refused(capsys, "serve", f"{flag}={value}", "--data-dir", str(data_dir))
    assert line.startswith(f"semantic serve: error: argument {flag}: {message}")
    assert not data_dir.exists()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "cannot read"),
        ("{", "the quotas are not JSON"),
        ('{"../x": {"disk_mb": 64}}', "invalid namespace '../x'"),
        ('{"team-a": {"disk": 64}}', "the quota of 'team-a' takes memory_mb, disk_mb"),
        ('{"team-a": {"disk_mb": "64"}}', "team-a.disk_mb must be a number of MiB"),
    ],
)
def test_a_bad_quotas_file_is_refused_before_the_model_loads(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str | None, message: str
) -> None:
    quotas = tmp_path / "quotas.json"
    if text is not None:
        quotas.write_text(text)
    data_dir = tmp_path / "data"
    line = refused(capsys, "serve", "--namespace-quotas", str(quotas), "--data-dir", str(data_dir))
    assert line.startswith("semantic serve: error: argument --namespace-quotas: "), line
    assert message in line
    assert not data_dir.exists()


def test_the_prefault_may_be_the_whole_kv_budget_and_defaults_to_at_most_it() -> None:
    args = _parser().parse_args(["serve", "--kv-budget-mb", "512", "--prefault-mb", "512"])
    args.check(args)
    args = _parser().parse_args(["serve", "--kv-budget-mb", "512"])
    args.check(args)  # the default prefault (1,024 MiB) shrinks to a smaller budget
    assert args.prefault_mb is None


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--max-tokens", "0", "must be positive, not 0"),
        ("--max-tokens", "-3", "must be positive"),
        ("--temperature", "-1", "must be from 0 to 2, not -1"),
        ("--temperature", "2.5", "must be from 0 to 2, not 2.5"),
        ("--top-p", "0", "top_p must be in (0, 1]"),
        ("--top-p", "1.5", "top_p must be in (0, 1]"),
        ("--seed", "-1", "must be 0 or more"),
        ("--seed", str(2**63), "seed must be in [0, 2^63)"),
        ("--stop", "", "must not be empty"),
    ],
)
def test_generate_refuses_a_bad_flag_before_loading_the_model(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, flag: str, value: str, message: str
) -> None:
    models = tmp_path / "models"
    line = refused(capsys, "generate", "hi", f"{flag}={value}", "--model-cache", str(models))
    assert line.startswith(f"semantic generate: error: argument {flag}: {message}")
    assert not models.exists()


def test_an_unknown_host_is_refused_before_the_data_directory_is_made(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    code = main(["serve", "--host", "no.such.host.invalid", "--data-dir", str(data_dir)])
    assert code == 2
    assert capsys.readouterr().err.startswith("error: cannot resolve --host 'no.such.host.invalid'")
    assert not data_dir.exists()


def test_version_prints_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"semantic {version('semantic')}\n"


def test_an_unknown_flag_is_named_by_its_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(capsys, "generate", "hi", "--bogus")
    assert line == "semantic generate: error: unrecognized arguments: --bogus"


def test_data_dir_on_generate_says_whose_flag_it_is(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(capsys, "generate", "--data-dir", "x", "hi")
    assert line.endswith("--data-dir is serve's (nothing else keeps data)")


@pytest.mark.parametrize(
    ("choice", "format_"),
    [("q4", "quantized"), ("quantized", "quantized"), ("q8", "q8"), ("bf16", "bf16")],
)
def test_weights_choices_name_the_format_they_convert_to(choice: str, format_: str) -> None:
    from semantic.bootstrap import weight_format
    from semantic.config import Settings

    args = _parser().parse_args(["serve", "--weights", choice])
    assert weight_format(Settings(weights=args.weights)) == format_


def test_weights_auto_leaves_the_format_to_the_model_source() -> None:
    """The embedded model's default here, or a GGUF file's own bits."""
    from semantic.bootstrap import weight_format
    from semantic.config import Settings

    assert weight_format(Settings()) is None


def test_a_disk_quota_below_one_block_of_the_model_is_refused_at_start() -> None:
    """Known once the model is: a namespace's quota is held to one block, so is the
    disk's (``--disk-quota-mb 1`` kept nothing on disk, silently)."""
    from semantic.bootstrap.services import _disk_quota
    from semantic.config import Settings
    from semantic.domain.cache_spec import ModelCacheSpec

    spec = ModelCacheSpec(30, 3, 64, 64, "float32", (None,) * 30)  # SmolLM2's: 11.2 MiB a block
    with pytest.raises(InvalidRequestError, match=r"--disk-quota-mb 1 is less than one KV block"):
        _disk_quota(Settings(disk_quota_bytes=1 << 20), spec)
    assert _disk_quota(Settings(disk_quota_bytes=12 << 20), spec) == 12 << 20
    assert _disk_quota(Settings(), spec) is None
