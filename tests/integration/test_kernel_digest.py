"""Our kernels give the same bits on every variant (ADR 0026): ``tests/native/kernel_digest.c``
runs the products (every tile shape, with and without a scalar tail), the softmax and value
sums, RMS norm, SwiGLU and RoPE on fixed inputs, built as each x86 variant this CPU runs,
by gcc and clang, and for arm64 (NEON) run under qemu-user where Debian's cross compiler
and qemu are installed (``scripts/setup.sh`` installs both)."""

from __future__ import annotations

import platform
import shutil
import subprocess
from pathlib import Path

import pytest

from semantic.adapters.mlx.cpu.blas_probe import this_cpus_flags
from semantic.adapters.mlx.cpu.kernel_variant import this_cpus_variants, variant_flags
from semantic.adapters.mlx.cpu.native_build import NATIVE_DIR

_HERE = Path(__file__).resolve().parents[1] / "native"
_SOURCES = [
    _HERE / "kernel_digest.c",
    _HERE / "llama_pieces.c",
    NATIVE_DIR / "small_sgemm.c",
    NATIVE_DIR / "softmax_pv.c",
]
_CROSS_CC, _QEMU = "aarch64-linux-gnu-gcc", "qemu-aarch64"


def _digest(tmp_path: Path, name: str, command: list[str], runner: list[str]) -> tuple[str, bytes]:
    binary = tmp_path / name
    subprocess.run(
        [*command, "-O3", f"-I{NATIVE_DIR}", '-DBLAS_TARGET="none"', "-o", str(binary)]
        + [str(s) for s in _SOURCES]
        + ["-lm", "-ldl", "-lpthread"],
        check=True,
        capture_output=True,
        timeout=180,
    )
    done = subprocess.run([*runner, str(binary)], check=True, capture_output=True, timeout=180)
    return done.stderr.decode().strip(), done.stdout


def _builds() -> list[tuple[str, list[str], list[str]]]:
    """(name, compiler and flags, how to run it) for every build this machine can make."""
    builds: list[tuple[str, list[str], list[str]]] = []
    flags = this_cpus_flags()
    for variant in this_cpus_variants():
        if variant == "baseline":
            continue
        for compiler in ("gcc", "clang"):
            if shutil.which(compiler):
                builds.append((variant, [compiler, *variant_flags(variant, flags)], []))
    if shutil.which(_CROSS_CC) and shutil.which(_QEMU) and platform.machine() != "aarch64":
        builds.append(("neon", [_CROSS_CC, "-static"], [_QEMU]))
    return builds


def test_every_variant_and_compiler_gives_the_same_bits(tmp_path: Path) -> None:
    builds = _builds()
    if len(builds) < 2:
        pytest.skip(f"only {[b[0] for b in builds]} can be built here")
    outputs = {}
    for index, (variant, command, runner) in enumerate(builds):
        said, output = _digest(tmp_path, f"digest-{index}", command, runner)
        assert said == variant, (command, said)  # built as the variant it was meant to be
        outputs[f"{variant} ({command[0]})"] = output
    reference = next(iter(outputs.values()))
    assert len(reference) > 400_000  # every part wrote its outputs
    differing = [name for name, output in outputs.items() if output != reference]
    assert not differing, f"differ from {next(iter(outputs))}: {differing}"


def test_the_arm64_build_runs_where_its_tools_are() -> None:
    """Says whether the NEON variant was part of the comparison above (skips if not)."""
    if platform.machine() == "aarch64":
        pytest.skip("on arm64 the first test builds NEON natively")
    if not (shutil.which(_CROSS_CC) and shutil.which(_QEMU)):
        pytest.skip(f"no {_CROSS_CC} or {_QEMU} here (scripts/setup.sh installs them)")
    assert any(name == "neon" for name, _, _ in _builds())
