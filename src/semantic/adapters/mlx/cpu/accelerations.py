"""Which fast paths run for this model on this machine, and why the others do not.

Each acceleration decides from what the model's layers are and what the machine has (its
own ``obstacle`` check, the same one that switches it on), never from a name alone. The
server logs one line per acceleration at start and serves the list in
``GET /v1/models/{id}`` (``runtime.accelerations``), so a slow path is never silent.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from semantic.adapters.mlx.cpu import attention, host_pass, host_swiglu, host_weights, jit
from semantic.adapters.mlx.cpu.blas import SHIM_ENV, BlasStatus
from semantic.adapters.mlx.cpu.blas_probe import this_cpus_flags
from semantic.adapters.mlx.cpu.compute_threads import allowed_cpus, compute_threads
from semantic.adapters.mlx.cpu.fused_pass import fusion_obstacle
from semantic.adapters.mlx.cpu.kernel_variant import VARIANT_ENV, choose_variant, variants_here
from semantic.adapters.mlx.cpu.page_placement import PagePlacement
from semantic.adapters.mlx.cpu.side_by_side import SIDE_BY_SIDE_ENV
from semantic.adapters.mlx.models.model_parts import BodyAndHead, not_sliceable


@dataclass(frozen=True, slots=True)
class Acceleration:
    name: str
    why_not: str | None
    """None when it runs."""
    note: str | None = None
    """What a running one is still doing."""

    @property
    def on(self) -> bool:
        return self.why_not is None

    def describe(self) -> str:
        if self.why_not is not None:
            return f"off: {self.why_not}"
        return "on" if self.note is None else f"on ({self.note})"


HUGE_PAGES = "weights on huge pages (ADR 0032)"


def accelerations(
    model: Any, blas: BlasStatus, pages: PagePlacement | None
) -> tuple[Acceleration, ...]:
    host = host_pass.obstacle(model)
    narrow = host_weights.products_obstacle(model)
    return (
        Acceleration("fast BLAS", None if blas.fast else blas.remedy),
        Acceleration("small-product matmul kernels (ADR 0010)", _kernels_here(blas)),
        Acceleration("native MLX JIT (ADR 0012)", jit.obstacle()),
        Acceleration("host softmax attention (ADR 0008)", _attention_obstacle(model)),
        Acceleration("host pass for small passes (ADR 0013)", host),
        Acceleration("prompt chunks' SwiGLU in vector lanes (ADR 0013)", _swiglu(model, host)),
        Acceleration("bfloat16 and 4/8-bit products on our kernels (ADR 0031)", narrow),
        Acceleration("prompt chunks ride decode steps (ADR 0009)", fusion_obstacle(model)),
        Acceleration("long prompts sliced between decode steps (ADR 0009)", _slice_obstacle(model)),
        Acceleration("decode body beside the slice (ADR 0015)", _beside_obstacle(host)),
        weights_on_huge_pages(pages),
    )


def _kernels_here(blas: BlasStatus) -> str | None:
    return kernels_obstacle(blas, platform.machine(), this_cpus_flags(), os.environ)


SGEMV_FALLBACK = "products of up to three rows go to sgemv, the rest to OpenBLAS"


def kernels_obstacle(
    blas: BlasStatus, machine: str, flags: frozenset[str], environ: Mapping[str, str]
) -> str | None:
    """Why our small-product kernels do not run, from what the machine is (``machine`` as
    ``platform.machine()`` says, the CPU's flags) and what the shim says it was built as:
    every variant with fused multiply-add has them (AVX-512, AVX2 + FMA, NEON), so only a
    CPU without one, the baseline asked for by name, or a compiler that built the shim
    without this CPU's vector units leaves them off; each is named."""
    if blas.small_kernels:
        return None
    if not blas.shim:
        if environ.get(SHIM_ENV) == "0":
            return f"{SHIM_ENV}=0"
        if "openblas" not in blas.name.lower():
            return f"needs OpenBLAS ({blas.name} here)"
        return "the shim did not build or load (no C compiler? the log says why)"
    variant = choose_variant(environ, machine, flags)
    if variant.name == "baseline" and variant.asked:
        return f"{VARIANT_ENV}=baseline; {SGEMV_FALLBACK}"
    if variants_here(machine, flags) == ("baseline",):
        has = f"{machine} CPU" if machine.lower() not in ("x86_64", "amd64") else "x86 CPU"
        return f"no AVX2 + FMA, AVX-512 or NEON on this {has}; {SGEMV_FALLBACK}"
    built = blas.compiler or "the C compiler"
    return (
        f"this CPU runs {variant.name} but {built} built the kernels without fused"
        f" multiply-add (the log says if it rejected -march=native); {SGEMV_FALLBACK}"
    )


def _attention_obstacle(model: Any) -> str | None:
    """The wrapper is installed for any dtype (riding and slicing go through it), but its
    host softmax runs on float32 activations only: others get MLX's attention."""
    if (why := attention.obstacle(model)) is not None:
        return why
    dtype = model.model.layers[0].input_layernorm.weight.dtype
    if dtype != mx.float32:
        name = str(dtype).rsplit(".", 1)[-1]
        return f"{name} activations: float32 only (MLX's own attention runs)"
    return None


def _slice_obstacle(model: Any) -> str | None:
    """Llama-bodied layers are sliced into steps; Gemma 3's and Phi-3's run whole, one
    step each (``layer_slice``)."""
    if BodyAndHead.of(model) is None:
        return not_sliceable(model)
    return None


def _swiglu(model: Any, host: str | None) -> str | None:
    if host is not None:
        return "needs the host pass"
    return None if host_swiglu.installed(model) else "not installed at load"


def weights_on_huge_pages(placement: PagePlacement | None) -> Acceleration:
    """On while the move goes on (the server does not wait for it), then as it ended."""
    if placement is None:
        return Acceleration(HUGE_PAGES, "not placed at load")
    if (pages := placement.pages) is None:
        return Acceleration(HUGE_PAGES, None, "moving beside the server, in its idle time")
    return Acceleration(HUGE_PAGES, None if pages.mostly else pages.describe())


def _beside_obstacle(host: str | None) -> str | None:
    if host is not None:
        return "needs the host pass"
    if allowed_cpus() < 2:
        return "one CPU allowed to this process"
    if compute_threads() is None:
        return f"{SIDE_BY_SIDE_ENV}=0, or not OpenBLAS with our kernels"
    return None
