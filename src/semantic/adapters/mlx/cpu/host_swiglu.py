"""The C pass's SwiGLU for the prompt chunks MLX's graph computes.

MLX's CPU exp is scalar (~12 ns a value on the Zen 3 VM of ADR 0013). In a 256-row chunk of
SmolLM2 there the MLP's SwiGLU (mlx-lm's compiled ``swiglu``) took 5.3 ms a layer beside
13.5 ms for its three products: a sixth of a cold prompt's time. The C pass computes it in
vector lanes (``native/llama_pass.c``); ``semantic_swiglu`` runs that loop on our two
threads.

Where the host pass runs a model, its llama MLPs call this one instead of mlx-lm's, so the
whole-layer path (mlx-lm's body), the layer slice and the fused pass compute the same
SwiGLU, and it is the C pass's: a value's bits are the same in every path and at every row
count (the loop works value by value). It costs a wait for the two products before it, in
a layer that already waits once for attention. The host pass's name in the fingerprint
says so (``host_pass.NAME``).
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import mlx.core as mx
import numpy as np

from semantic.adapters.mlx.cpu.llama_native import native_library
from semantic.adapters.mlx.lm import swiglu as mlx_swiglu
from semantic.adapters.mlx.models.model_parts import MLPS


class HostSwigluMLP:
    """``down(swiglu(gate(x), up(x)))`` with the C pass's SwiGLU: mixed into each of
    mlx-lm's llama MLP classes (``MLPS``)."""

    def __call__(self, x: mx.array) -> mx.array:
        mlp: Any = self
        out: mx.array = mlp.down_proj(swiglu(mlp.gate_proj(x), mlp.up_proj(x)))
        return out


_HOST_CLASSES: dict[type, type] = {
    kind: type(f"Host{kind.__module__.rsplit('.', 1)[-1].title()}MLP", (HostSwigluMLP, kind), {})
    for kind in MLPS
}


def install(model: Any) -> bool:
    """Give each layer's MLP the host SwiGLU where the host pass runs this model.

    The MLP object stays the same (its class becomes a subclass of its own that only
    changes the call): its linear layers, and whatever was installed in them, stay put."""
    from semantic.adapters.mlx.cpu import host_pass  # which reads layers (llama_layer): here

    if not host_pass.supported(model):
        return False
    for layer in model.model.layers:
        if type(layer.mlp) in _HOST_CLASSES:  # not installed yet
            layer.mlp.__class__ = _HOST_CLASSES[type(layer.mlp)]
    return True


def installed(model: Any) -> bool:
    """Every layer's MLP calls the host SwiGLU (what the server reports)."""
    layers = getattr(getattr(model, "model", None), "layers", None) or []
    return bool(layers) and all(isinstance(layer.mlp, HostSwigluMLP) for layer in layers)


def swiglu(gate: mx.array, up: mx.array) -> mx.array:
    """``silu(gate) * up``, as the C pass computes it; mlx-lm's where the rows are not
    float32 (the C pass's rows always are)."""
    if gate.dtype != mx.float32 or up.dtype != mx.float32:
        theirs: mx.array = mlx_swiglu(gate, up)
        return theirs
    mx.eval(gate, up)
    out = np.array(gate, dtype=np.float32)  # our own copy: the kernel writes in place
    ups = np.ascontiguousarray(up, dtype=np.float32)
    _kernel()(out.ctypes.data, ups.ctypes.data, out.size)
    return mx.array(out)


@functools.cache
def _kernel() -> Any:
    library = native_library()
    assert library is not None  # install() ran only where the host pass (and so this) runs
    function = library.semantic_swiglu
    function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]
    function.restype = None
    return function
