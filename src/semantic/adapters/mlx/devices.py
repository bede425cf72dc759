"""Which MLX device runs the model: the CPU, Apple's GPU (Metal) or an NVIDIA GPU (CUDA).

MLX picks the GPU by itself where it has one. The host-side fast paths (the C pass, the host
softmax, numpy views of MLX buffers) only make sense where the model's arrays live in the
memory the CPU works on: the CPU device. ``--device cpu`` keeps a GPU machine on them.
"""

from __future__ import annotations

import logging

import mlx.core as mx

from semantic.adapters.mlx.errors import ModelSetupError

log = logging.getLogger(__name__)

DEVICE_CHOICES = ("auto", "cpu", "gpu")


def use_device(choice: str) -> str:
    """Make ``choice`` MLX's default device before the model loads; returns its name."""
    if choice not in DEVICE_CHOICES:
        raise ModelSetupError(f"device must be one of {', '.join(DEVICE_CHOICES)}, not {choice!r}")
    if choice == "gpu":
        if gpu_kind() is None:
            raise ModelSetupError(
                "--device gpu: this MLX has no GPU backend here (macOS: Metal; Linux: "
                'pip install "semantic[cuda]" on a machine with an NVIDIA GPU)'
            )
        mx.set_default_device(mx.gpu)
    elif choice == "cpu":
        mx.set_default_device(mx.cpu)
    return device_name()


def gpu_kind() -> str | None:
    """``metal``, ``cuda``, or None where MLX has no GPU backend."""
    if _available("metal"):
        return "metal"
    if _available("cuda"):
        return "cuda"
    return None


def on_cpu() -> bool:
    """The model runs on the CPU: the host fast paths apply."""
    return bool(mx.default_device() == mx.cpu)


def device_name() -> str:
    return "cpu" if on_cpu() else f"gpu ({gpu_kind() or 'unknown'})"


def _available(backend: str) -> bool:
    module = getattr(mx, backend, None)
    check = getattr(module, "is_available", None)
    try:
        return bool(check()) if callable(check) else False
    except RuntimeError:
        return False
