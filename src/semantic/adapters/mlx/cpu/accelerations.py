"""Which fast paths run for this model on this machine, and why the others do not.

Each acceleration decides from what the model's layers are and what the machine has (its
own ``obstacle`` check, the same one that switches it on), never from a name alone. The
server logs one line per acceleration at start and serves the list in
``GET /v1/models/{id}`` (``runtime.accelerations``), so a slow path is never silent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from semantic.adapters.mlx.cpu import attention, host_pass
from semantic.adapters.mlx.cpu.blas import SHIM_ENV, BlasStatus, compute_threads
from semantic.adapters.mlx.cpu.fused_pass import fusion_obstacle
from semantic.adapters.mlx.cpu.jit import JIT_ENV, use_native_jit
from semantic.adapters.mlx.cpu.side_by_side import SIDE_BY_SIDE_ENV
from semantic.adapters.mlx.models.model_parts import BodyAndHead, not_sliceable


@dataclass(frozen=True, slots=True)
class Acceleration:
    name: str
    why_not: str | None
    """None when it runs."""

    @property
    def on(self) -> bool:
        return self.why_not is None

    def describe(self) -> str:
        return "on" if self.why_not is None else f"off: {self.why_not}"


def accelerations(model: Any, blas: BlasStatus) -> tuple[Acceleration, ...]:
    host = host_pass.obstacle(model)
    return (
        Acceleration("fast BLAS", None if blas.fast else blas.remedy),
        Acceleration("small-product matmul kernels (ADR 0010)", _kernels_obstacle(blas)),
        Acceleration("native MLX JIT (ADR 0012)", None if use_native_jit() else _jit_obstacle()),
        Acceleration("host softmax attention (ADR 0008)", _attention_obstacle(model)),
        Acceleration("host pass for small passes (ADR 0013)", host),
        Acceleration("prompt chunks ride decode steps (ADR 0009)", fusion_obstacle(model)),
        Acceleration("long prompts sliced between decode steps (ADR 0009)", _slice_obstacle(model)),
        Acceleration("decode body beside the slice (ADR 0015)", _beside_obstacle(host)),
    )


def _kernels_obstacle(blas: BlasStatus) -> str | None:
    if blas.small_kernels:
        return None
    if not blas.shim:
        return f"not built or {SHIM_ENV}=0 (needs OpenBLAS and a C compiler)"
    return "no AVX-512 here: up to three rows go to sgemv"


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


def _jit_obstacle() -> str:
    return f"{JIT_ENV}=0, or no g++ on PATH"


def _slice_obstacle(model: Any) -> str | None:
    """Llama-bodied layers are sliced into steps; Gemma 3's and Phi-3's run whole, one
    step each (``layer_slice``)."""
    if BodyAndHead.of(model) is None:
        return not_sliceable(model)
    return None


def _beside_obstacle(host: str | None) -> str | None:
    if host is not None:
        return "needs the host pass"
    if compute_threads() is None:
        return f"{SIDE_BY_SIDE_ENV}=0, or not OpenBLAS with our kernels"
    return None
