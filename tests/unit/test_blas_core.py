"""Which OpenBLAS core a CPU runs on: a generic fallback is replaced by the best core the
CPU's flags allow and the library proves it can run; anything else stands."""

from __future__ import annotations

import pytest

from semantic.adapters.mlx.cpu.blas_core import (
    CoreDecision,
    CoreReason,
    candidate_cores,
    cpu_flags,
    is_generic,
    prompt_products_ours,
    wider_core,
)
from semantic.adapters.mlx.cpu.blas_probe import ProbeResult, decide_core

AVX512 = {"sse4_2", "avx", "avx2", "fma", "avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl"}
AVX512_BF16 = AVX512 | {"avx512_bf16", "amx_tile"}
AVX2 = {"sse4_2", "avx", "avx2", "fma"}


@pytest.mark.parametrize(
    ("detected", "flags", "expected"),
    [
        ("Prescott", AVX512_BF16, ("Cooperlake", "SkylakeX", "Haswell")),
        ("Prescott", AVX512, ("SkylakeX", "Haswell")),
        ("KATMAI", AVX512, ("SkylakeX", "Haswell")),
        ("Core2", AVX2, ("Haswell",)),
        ("Nehalem", {"sse4_2", "avx"}, ("Sandybridge",)),
        ("Nehalem", {"sse4_2"}, ()),
        ("Haswell", AVX512_BF16, ()),
        ("SkylakeX", AVX512_BF16, ()),
        ("Zen", AVX512, ()),
        (None, AVX512, ()),
    ],
)
def test_a_generic_core_is_replaced_by_what_the_flags_allow(
    detected: str | None, flags: set[str], expected: tuple[str, ...]
) -> None:
    assert candidate_cores(detected, flags) == expected


def test_generic_cores_are_recognised_in_any_case() -> None:
    assert is_generic("Prescott")
    assert is_generic("core2")
    assert is_generic("NEHALEM")
    assert not is_generic("Haswell")
    assert not is_generic(None)


def test_flags_are_read_from_cpuinfo() -> None:
    text = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu sse avx2 avx512f\n"
    assert cpu_flags(text) == {"fpu", "sse", "avx2", "avx512f"}
    assert cpu_flags("Features\t: fp asimd\n") == {"fp", "asimd"}
    assert cpu_flags("") == frozenset()


class FakeLibrary:
    """Answers probes as an old OpenBLAS on a new CPU would: it detects Prescott."""

    def __init__(self, detected: str, works: dict[str, bool]) -> None:
        self.detected = detected
        self.works = works
        """Each core it has, and whether its products come out right (absent: crashes)."""
        self.asked: list[str | None] = []

    def __call__(self, library: str, coretype: str | None) -> ProbeResult | None:
        self.asked.append(coretype)
        if coretype is None:
            return ProbeResult(self.detected, "OpenBLAS 0.3.21", right=True)
        if coretype not in self.works:
            return None
        return ProbeResult(coretype, "OpenBLAS 0.3.21", right=self.works[coretype])


def test_the_best_core_that_works_is_chosen() -> None:
    library = FakeLibrary("Prescott", {"Cooperlake": True, "SkylakeX": True})
    decision, coretype = decide_core("libopenblas.so.0", {}, AVX512_BF16, library)
    assert coretype == "Cooperlake"
    assert decision.core == "Cooperlake"
    assert decision.reason is CoreReason.CHOSEN
    assert decision.detected == "Prescott"


def test_a_core_with_wrong_products_or_a_crash_is_skipped() -> None:
    library = FakeLibrary("Prescott", {"SkylakeX": False, "Haswell": True})
    decision, coretype = decide_core("libopenblas.so.0", {}, AVX512_BF16, library)
    assert coretype == "Haswell"
    assert library.asked == [None, "Cooperlake", "SkylakeX", "Haswell"]
    assert not decision.generic


def test_a_build_that_names_another_core_than_asked_does_not_have_it() -> None:
    class Renaming(FakeLibrary):
        def __call__(self, library: str, coretype: str | None) -> ProbeResult | None:
            super().__call__(library, coretype)
            return ProbeResult("Prescott", "OpenBLAS 0.3.21", right=True)

    decision, coretype = decide_core("lib", {}, AVX512, Renaming("Prescott", {}))
    assert coretype is None
    assert decision.core == "Prescott"
    assert decision.reason is CoreReason.DETECTED
    assert decision.generic


def test_when_nothing_better_works_the_detected_core_stays() -> None:
    decision, coretype = decide_core("lib", {}, AVX2, FakeLibrary("Core2", {}))
    assert coretype is None
    assert decision.core == "Core2"
    assert decision.reason is CoreReason.DETECTED


def test_a_core_the_user_set_is_never_overridden() -> None:
    library = FakeLibrary("Prescott", {"Cooperlake": True})
    decision, coretype = decide_core("lib", {"OPENBLAS_CORETYPE": "Prescott"}, AVX512, library)
    assert coretype is None
    assert decision.reason is CoreReason.ENVIRONMENT
    assert library.asked == []


def test_a_recognised_core_is_kept_without_trying_others() -> None:
    library = FakeLibrary("Haswell", {"Cooperlake": True})
    decision, coretype = decide_core("lib", {}, AVX512_BF16, library)
    assert coretype is None
    assert decision.core == "Haswell"
    assert library.asked == [None]


@pytest.mark.parametrize(
    ("asked", "flags", "expected"),
    [
        ("Haswell", AVX512_BF16, "Cooperlake"),
        ("haswell", AVX512, "SkylakeX"),
        ("SkylakeX", AVX512_BF16, None),  # Cooperlake's float32 kernels are SkylakeX's
        ("Cooperlake", AVX512_BF16, None),
        ("Haswell", AVX2, None),
        ("Zen", AVX512_BF16, None),
        (None, AVX512_BF16, None),
    ],
)
def test_a_core_the_environment_narrows_names_the_wider_one_the_cpu_runs(
    asked: str | None, flags: set[str], expected: str | None
) -> None:
    assert wider_core(asked, flags) == expected


def test_the_report_says_the_environment_core_stands_and_what_is_wider() -> None:
    decision = CoreDecision("Haswell", CoreReason.ENVIRONMENT, wider="Cooperlake")
    described = decision.describe()
    assert described.startswith("core Haswell, set by OPENBLAS_CORETYPE in the environment")
    assert "Cooperlake" in described
    assert "unset OPENBLAS_CORETYPE" in described
    assert "Cooperlake" not in CoreDecision("Haswell", CoreReason.ENVIRONMENT).describe()


@pytest.mark.parametrize(
    ("core", "variant", "ours"),
    [
        ("Haswell", "avx512", True),  # a profile's AVX2 core on an AVX-512 CPU
        ("Prescott", "avx2", True),  # a generic fallback kept (SEMANTIC_BLAS_CORE_CHOICE=0)
        ("Cooperlake", "avx512", False),
        ("SkylakeX", "avx512", False),
        ("Haswell", "avx2", False),
        ("Zen", "avx2", False),
        ("Haswell", "baseline", False),  # no kernels of ours
        ("NEOVERSEN1", "neon", False),  # a core not listed: OpenBLAS's judgement stands
        (None, "avx512", False),
    ],
)
def test_a_prompts_products_are_ours_only_where_our_vectors_are_wider(
    core: str | None, variant: str, ours: bool
) -> None:
    assert prompt_products_ours(core, variant) is ours
