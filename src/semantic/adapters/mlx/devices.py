"""Which MLX device runs the model: the CPU, Apple's GPU (Metal) or an NVIDIA GPU (CUDA).

MLX picks the GPU by itself where it has one. The host-side fast paths (the C pass, the host
softmax, numpy views of MLX buffers) only make sense where the model's arrays live in the
memory the CPU works on: the CPU device. ``--device cpu`` keeps a GPU machine on them.

The KV codec's host-memory tricks (numpy views of MLX buffers, restore buffers filled in
place, a CPU stream for the gather) are decided once, by ``host_memory``: on the CPU and on
Apple's unified memory they stay; on CUDA the KV moves through MLX arrays and host copies.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import mlx.core as mx

from semantic.adapters.mlx.errors import ModelSetupError

log = logging.getLogger(__name__)

DEVICE_CHOICES = ("auto", "cpu", "gpu")
HOST_VIEWS_ENV = "SEMANTIC_KV_HOST_VIEWS"
"""``0``: move the KV through MLX arrays even where numpy could view it (a check on the CPU
of the path a CUDA device takes)."""


@dataclass(frozen=True, slots=True)
class HostMemory:
    """Whether the model's arrays lie in memory numpy may view and write in place.

    Where they do not (CUDA: device memory, at best migrated page by page), a numpy view
    of an MLX array is a copy or a migration, and a write through it may never reach the
    array: restores build MLX arrays from the file's bytes, gathers run on the device's
    own stream, and exports copy to the host."""

    addressable: bool
    reason: str

    def describe(self) -> str:
        how = "host views" if self.addressable else "MLX arrays"
        return f"{how} ({self.reason})"


HOST_VIEWS = HostMemory(True, "the model runs on the CPU")
"""The CPU's answer: what a codec or backend built without a decision assumes."""


def host_memory() -> HostMemory:
    """The KV path for MLX's default device (call after ``use_device``)."""
    if os.environ.get(HOST_VIEWS_ENV) == "0":
        return HostMemory(False, f"{HOST_VIEWS_ENV}=0")
    if on_cpu():
        return HOST_VIEWS
    if gpu_kind() == "metal":
        return HostMemory(True, "unified memory (Metal)")
    return HostMemory(False, f"{device_name()} memory is not host-addressable")


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
