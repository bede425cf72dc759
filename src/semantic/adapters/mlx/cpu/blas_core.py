"""Which OpenBLAS core a CPU should run on, as a pure function of what was detected.

OpenBLAS built with ``DYNAMIC_ARCH`` picks its kernels at load time from the CPU's model
number. A build older than the CPU does not know the number and falls back to a generic
core: Debian 12's 0.3.21 runs newer Xeons as ``Prescott`` (SSE3), 3x slower than on its
``SkylakeX`` kernels (issue 31). The CPU's flags say which kernels it can run, so when the
detected core is such a fallback we choose by the flags instead. ADR 0004 has the numbers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

CORETYPE_ENV = "OPENBLAS_CORETYPE"

GENERIC_CORES = frozenset(
    {
        "katmai",
        "coppermine",
        "northwood",
        "prescott",
        "banias",
        "core2",
        "penryn",
        "dunnington",
        "nehalem",
        "atom",
        "athlon",
        "opteron",
        "opteron_sse3",
        "barcelona",
        "generic",
    }
)
"""Cores OpenBLAS falls back to for a CPU it does not know: at most SSE4.2, no AVX."""

_AVX512_CORE = frozenset({"avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl"})
"""What OpenBLAS's SkylakeX kernels need (its own ``support_avx512`` check)."""

_BY_FLAGS: tuple[tuple[frozenset[str], tuple[str, ...]], ...] = (
    (_AVX512_CORE | {"avx512_bf16"}, ("Cooperlake", "SkylakeX", "Haswell")),
    (_AVX512_CORE, ("SkylakeX", "Haswell")),
    (frozenset({"avx2", "fma"}), ("Haswell",)),
    (frozenset({"avx"}), ("Sandybridge",)),
)
"""Best first: a build too old to have a core (Cooperlake came in 0.3.11) gets the next."""


class CoreReason(StrEnum):
    """Why the process runs on the core it does; said in the log and in ``/v1/models``."""

    DETECTED = "detected by OpenBLAS"
    CHOSEN = "chosen from the CPU's flags: OpenBLAS detected only a generic core"
    ENVIRONMENT = "set by OPENBLAS_CORETYPE in the environment"
    NOT_OPENBLAS = "not OpenBLAS"


@dataclass(frozen=True, slots=True)
class CoreDecision:
    core: str | None
    """The core OpenBLAS reports it runs on; None when it cannot say."""
    reason: CoreReason
    detected: str | None = None
    """What OpenBLAS picked by itself, when we chose something else."""
    wider: str | None = None
    """A wider core the CPU's flags allow than the one the environment asked for."""

    @property
    def generic(self) -> bool:
        return is_generic(self.core)

    def describe(self) -> str:
        if self.core is None:
            return str(self.reason)
        extra = f" (it detected {self.detected})" if self.detected else ""
        if self.wider:
            extra += f"; this CPU's flags allow {self.wider}'s wider kernels: unset {CORETYPE_ENV}"
        return f"core {self.core}, {self.reason}{extra}"


def is_generic(core: str | None) -> bool:
    return core is not None and core.strip().lower() in GENERIC_CORES


def candidate_cores(detected: str | None, cpu_flags: Iterable[str]) -> tuple[str, ...]:
    """The cores to try in place of ``detected``, best first; empty when it should stay.

    Only a generic fallback is replaced, and only on a CPU whose flags promise more: a core
    OpenBLAS recognised is its own best judgement.
    """
    if not is_generic(detected):
        return ()
    return _cores_for(cpu_flags)


def wider_core(asked: str | None, cpu_flags: Iterable[str]) -> str | None:
    """The best core the CPU's flags allow, where ``asked`` (the environment's choice) is
    a narrower one of the same list; None otherwise. The environment's choice stands (a
    machine's profile may set a core for reasons of its own); this only says what it costs:
    Haswell's AVX2 kernels where AVX-512 ones would run (ADR 0004)."""
    cores = [_float32_kernels(core) for core in _cores_for(cpu_flags)]
    mine = None if asked is None else _float32_kernels(asked)
    narrower = mine is not None and mine in cores[1:] and mine != cores[0]
    return _cores_for(cpu_flags)[0] if narrower else None


def _float32_kernels(core: str) -> str:
    """A core by the float32 kernels it runs: Cooperlake adds bfloat16 ones to SkylakeX's."""
    name = core.strip().lower()
    return "skylakex" if name == "cooperlake" else name


def _cores_for(cpu_flags: Iterable[str]) -> tuple[str, ...]:
    """The cores a CPU with these flags runs, best first (``_BY_FLAGS``)."""
    flags = frozenset(cpu_flags)
    for needed, cores in _BY_FLAGS:
        if needed <= flags:
            return cores
    return ()


_CORE_LANES = {"skylakex": 16, "cooperlake": 16, "sapphirerapids": 16, "haswell": 8, "zen": 8}
"""float32 lanes of the vectors an OpenBLAS core's sgemm kernels use (generic cores: 4)."""
_VARIANT_LANES = {"avx512": 16, "avx2": 8, "neon": 4}
"""float32 lanes of our kernel variants' vectors (``baseline`` has no kernels)."""


def core_lanes(core: str | None) -> int | None:
    """The float32 lanes of ``core``'s sgemm kernels; None for a core not listed here."""
    if core is None:
        return None
    return 4 if is_generic(core) else _CORE_LANES.get(core.strip().lower())


def prompt_products_ours(core: str | None, variant: str | None) -> bool:
    """Whether a prompt's products past 32 rows should run on our kernels rather than
    OpenBLAS's: where our variant's vectors are wider than those of the core OpenBLAS runs
    (Haswell's on an AVX-512 CPU, as a machine's profile may set it; ADR 0004)."""
    ours = _VARIANT_LANES.get(variant or "")
    theirs = core_lanes(core)
    return ours is not None and theirs is not None and ours > theirs


def user_core(environ: Mapping[str, str]) -> str | None:
    """The core the user (or the machine's profile) asked for; never overridden."""
    value = environ.get(CORETYPE_ENV, "").strip()
    return value or None


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The flags of the first processor in ``/proc/cpuinfo``'s text (Linux)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in {"flags", "Features"}:
            return frozenset(value.split())
    return frozenset()
