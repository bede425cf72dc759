"""The CPU accelerator: everything that makes MLX's CPU backend fast for llama-bodied models.

Inside: the host pass (``host_pass``, ``host_model``, ``buffer_layout``,
``native/llama_pass.c``), the fused pass that lets a prompt chunk ride a decode step
(``fused_pass``), the host softmax attention (``attention``, ``native/softmax_pv.c``), the
layer slice (``layer_slice``), the decode body beside it (``side_by_side``), the BLAS shim
and its small-product kernel (``blas*``, ``native/small_sgemm.c``), MLX's JIT for this CPU
(``jit``), building the C (``native_build``), malloc tuning and prefaulting (``memory``),
the weights on huge pages (``huge_pages``), the process preparation (``process``) and the
report of which of these run (``accelerations``).

This module is its one door (an import-linter contract keeps the rest of ``semantic`` out
of the modules above). Importing it changes nothing and loads no MLX: ``prepare_process``
must run before ``mlx.core`` loads, so what needs MLX is imported when first called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from semantic.adapters.mlx.cpu.blas import BlasStatus, preload_fast_blas, report_blas
from semantic.adapters.mlx.cpu.huge_pages import WeightPages
from semantic.adapters.mlx.cpu.memory import prefault_heap
from semantic.adapters.mlx.cpu.page_placement import PagePlacement
from semantic.adapters.mlx.cpu.process import PreparedProcess, prepare_process

if TYPE_CHECKING:
    from semantic.adapters.mlx.accelerator import Accelerator
    from semantic.adapters.mlx.cpu.accelerations import Acceleration

__all__ = [
    "BlasStatus",
    "PagePlacement",
    "PreparedProcess",
    "WeightPages",
    "accelerations_for",
    "accelerator_for",
    "huge_pages_line",
    "install_attention",
    "install_host_products",
    "install_host_swiglu",
    "kernel_name",
    "place_weights_on_huge_pages",
    "prefault_heap",
    "preload_fast_blas",
    "prepare_process",
    "report_blas",
]


def accelerator_for(model: Any) -> Accelerator:
    """What the backend is handed: this model's fast paths on this machine."""
    from semantic.adapters.mlx.cpu.cpu_accelerator import CpuAccelerator

    return CpuAccelerator.of(model)


def install_attention(model: Any) -> bool:
    """Swap in the host softmax attention where the model allows it (ADR 0008), at load."""
    from semantic.adapters.mlx.cpu.attention import install

    return install(model)


def install_host_products(model: Any) -> int:
    """A quantized model's products on our kernels (ADR 0031), at load; how many layers."""
    from semantic.adapters.mlx.cpu.host_weights import install

    return install(model)


def install_host_swiglu(model: Any) -> bool:
    """The C pass's SwiGLU in the MLPs of a model the host pass runs, at load (after the
    products)."""
    from semantic.adapters.mlx.cpu.host_swiglu import install

    return install(model)


def place_weights_on_huge_pages(model: Any, *, later: bool) -> PagePlacement:
    """The move of the loaded model's weights onto huge pages where Linux allows (ADR
    0032), last at load (after the installs above have settled which arrays the passes
    read): done now, or with ``later`` to be started once the server is up."""
    from semantic.adapters.mlx.cpu.page_placement import placement_for

    return placement_for(model, later=later)


def huge_pages_line(placement: PagePlacement) -> tuple[str, str]:
    """The report's line for the weights' huge pages, as their move stands now."""
    from semantic.adapters.mlx.cpu.accelerations import weights_on_huge_pages

    line = weights_on_huge_pages(placement)
    return line.name, line.describe()


def kernel_name(model: Any, host_attention: bool) -> str:
    """The kernels that compute this model's KV here, for the fingerprint."""
    from semantic.adapters.mlx.cpu import attention, blas, host_pass, host_weights, jit

    kernel = attention.kernel_name() if host_attention else "mlx-sdpa"
    if blas.blas_in_use().prompt_products:
        kernel += f"+{blas.PROMPT_PRODUCTS_NAME}"
    if jit.use_native_jit():
        kernel += f"+{jit.NAME}"
    if host_pass.supported(model):
        kernel += f"+{host_pass.NAME}"
    if host_weights.products_obstacle(model) is None:
        kernel += f"+{host_weights.NAME}"
    return kernel


def accelerations_for(
    model: Any, blas: BlasStatus, pages: PagePlacement | None
) -> tuple[Acceleration, ...]:
    """Which fast paths run for this model on this machine, and why the others do not
    (``pages``: what ``place_weights_on_huge_pages`` started at load)."""
    from semantic.adapters.mlx.cpu.accelerations import accelerations as found

    return found(model, blas, pages)
