"""Ask OpenBLAS, in a short child process, which core it picks and whether its products
are right there; then choose the core this process will load it with.

``OPENBLAS_CORETYPE`` is read once, when the library loads, so a core can only be tried
in a process that has not loaded it yet: a child, one per candidate (about 40 ms each). A
candidate that crashes the child, that this build does not have, or whose products come
out wrong is skipped (issue 31). Products are checked exactly: small integers, whose sums
float32 holds without rounding, against a reference computed in Python.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from semantic.adapters.mlx.cpu.blas_core import (
    CORETYPE_ENV,
    CoreDecision,
    CoreReason,
    candidate_cores,
    cpu_flags,
    user_core,
)

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 20.0
_CHILD = r"""
import ctypes, json, sys
lib = ctypes.CDLL(sys.argv[1])
lib.openblas_get_corename.restype = ctypes.c_char_p
lib.openblas_get_config.restype = ctypes.c_char_p
Floats = ctypes.POINTER(ctypes.c_float)
def product_right(m, n, k):
    a = [float((i * 7 + 3) % 5 - 2) for i in range(m * k)]
    b = [float((i * 11 + 1) % 5 - 2) for i in range(k * n)]
    c = (ctypes.c_float * (m * n))()
    lib.cblas_sgemm(101, 111, 111, m, n, k, ctypes.c_float(1.0),
        (ctypes.c_float * len(a))(*a), k, (ctypes.c_float * len(b))(*b), n,
        ctypes.c_float(0.0), c, n)
    return all(c[r * n + s] == sum(a[r * k + j] * b[j * n + s] for j in range(k))
               for r in range(m) for s in range(n))
right = all(product_right(*shape) for shape in ((1, 96, 64), (5, 40, 64), (70, 70, 64)))
print(json.dumps({"core": lib.openblas_get_corename().decode(),
    "config": lib.openblas_get_config().decode(), "right": right}))
"""


@dataclass(frozen=True, slots=True)
class ProbeResult:
    core: str
    config: str
    right: bool
    """Its products came out exact."""


def probe(library: str, coretype: str | None) -> ProbeResult | None:
    """What ``library`` does in a fresh process loaded under ``coretype`` (None: unset);
    None if that process failed (a core the CPU cannot run may kill it)."""
    environ = {k: v for k, v in os.environ.items() if k != CORETYPE_ENV}
    if coretype is not None:
        environ[CORETYPE_ENV] = coretype
    try:
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, library],
            env=environ,
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            check=True,
        )
        found = json.loads(done.stdout.strip().splitlines()[-1])
        return ProbeResult(str(found["core"]), str(found["config"]), bool(found["right"]))
    except (OSError, subprocess.SubprocessError, ValueError, IndexError, KeyError) as error:
        log.debug("OpenBLAS probe under %s failed: %s", coretype or "its own choice", error)
        return None


Prober = Callable[[str, "str | None"], "ProbeResult | None"]


def decide_core(
    library: str, environ: Mapping[str, str], flags: Iterable[str], prober: Prober = probe
) -> tuple[CoreDecision, str | None]:
    """The decision, and the ``OPENBLAS_CORETYPE`` to load ``library`` under (None: leave
    the environment as it is)."""
    if user_core(environ) is not None:
        return CoreDecision(None, CoreReason.ENVIRONMENT), None
    detected = prober(library, None)
    if detected is None:
        return CoreDecision(None, CoreReason.DETECTED), None
    for candidate in candidate_cores(detected.core, flags):
        tried = prober(library, candidate)
        if tried is None or tried.core.lower() != candidate.lower():
            log.debug("OpenBLAS has no working %s core here (%s)", candidate, tried)
            continue
        if not tried.right:
            log.warning("OpenBLAS's %s kernels compute wrong products here; skipped", candidate)
            continue
        return CoreDecision(tried.core, CoreReason.CHOSEN, detected.core), candidate
    return CoreDecision(detected.core, CoreReason.DETECTED), None


def this_cpus_flags() -> frozenset[str]:
    try:
        return cpu_flags(Path("/proc/cpuinfo").read_text())
    except OSError:
        return frozenset()
