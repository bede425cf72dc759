"""Fast paths are chosen by what the model's layers are and what the machine has, and each
one that is off says why."""

from __future__ import annotations

from dataclasses import replace

import mlx.core as mx
import pytest
from mlx import nn
from mlx.utils import tree_map
from mlx_lm.models import gemma3_text

from semantic.adapters.mlx.cpu import host_pass, host_weights
from semantic.adapters.mlx.cpu.accelerations import accelerations, kernels_obstacle
from semantic.adapters.mlx.cpu.attention import install
from semantic.adapters.mlx.cpu.blas import BlasStatus, blas_in_use
from semantic.adapters.mlx.cpu.page_placement import PagePlacement
from tests.conformance.tiny_models import FAMILIES
from tests.helpers import huge_pages_expected, tiny_family, tiny_llama
from tests.integration.conftest import RealModel


def _by_name(model: object, pages: PagePlacement | None = None) -> dict[str, str | None]:
    return {a.name: a.why_not for a in accelerations(model, blas_in_use(), pages)}


def test_the_embedded_model_gets_every_acceleration_this_machine_can_give(
    real_model: RealModel,
) -> None:
    placement = real_model.loaded.pages
    assert placement is not None
    placement.wait()  # the move goes on beside whatever runs: "on" while it does
    found = _by_name(real_model.loaded.model, placement)
    assert found["host softmax attention (ADR 0008)"] is None
    if huge_pages_expected():
        assert found["weights on huge pages (ADR 0032)"] is None, placement.pages
    assert found["prompt chunks ride decode steps (ADR 0009)"] is None
    assert found["long prompts sliced between decode steps (ADR 0009)"] is None
    if blas_in_use().small_kernels:
        assert found["host pass for small passes (ADR 0013)"] is None
    assert (found["host pass for small passes (ADR 0013)"] is None) == host_pass.supported(
        real_model.loaded.model
    )
    swiglu = found["prompt chunks' SwiGLU in vector lanes (ADR 0013)"]  # installed at load
    assert (swiglu is None) == host_pass.supported(real_model.loaded.model)


def test_a_model_the_fast_paths_do_not_cover_is_told_why() -> None:
    mx.random.seed(0)
    model = gemma3_text.Model(
        gemma3_text.ModelArgs(
            model_type="gemma3_text",
            hidden_size=64,
            num_hidden_layers=2,
            intermediate_size=128,
            num_attention_heads=2,
            head_dim=32,
            num_key_value_heads=1,
            vocab_size=256,
            sliding_window=64,
            sliding_window_pattern=2,
            query_pre_attn_scalar=32,
        )
    )
    found = _by_name(model)
    assert "gemma3_text" in (found["host softmax attention (ADR 0008)"] or "")
    assert found["host pass for small passes (ADR 0013)"]
    assert "gemma3_text" in (found["prompt chunks ride decode steps (ADR 0009)"] or "")
    assert found["long prompts sliced between decode steps (ADR 0009)"] is None  # layer by layer


def test_a_model_whose_layers_name_their_attention_otherwise_runs_on_mlx_lm() -> None:
    """InternLM2's layers keep theirs in ``attention``, not ``self_attn``: nothing of ours
    is installed, and the report says why (it once failed the load with AttributeError)."""
    from mlx_lm.utils import _get_classes

    config = {**FAMILIES["llama"], "model_type": "internlm2", "vocab_size": 256}
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    assert not install(model)
    found = _by_name(model)
    assert "internlm2" in (found["host softmax attention (ADR 0008)"] or "")
    assert "internlm2" in (found["host pass for small passes (ADR 0013)"] or "")


@pytest.mark.parametrize("family", ["gemma3_text", "phi3"])
def test_gemma3_and_phi3_are_sliced_but_ride_nothing_and_say_why(family: str) -> None:
    """Their layers run whole in a slice (test_layer_slice); the other paths read llama's
    layer and say so."""
    found = _by_name(tiny_family(family))
    assert found["long prompts sliced between decode steps (ADR 0009)"] is None
    for name in ("host softmax attention (ADR 0008)", "prompt chunks ride decode steps (ADR 0009)"):
        assert family in (found[name] or "")


def test_quantized_and_bfloat16_llamas_get_the_host_pass_once_our_products_are_installed() -> None:
    """4- and 8-bit weights and bfloat16 ones are read in place (ADR 0031); until the
    loader installs our products (and widens the rest to float32), the line says why."""
    name = "host pass for small passes (ADR 0013)"
    model = tiny_llama()
    nn.quantize(model, group_size=64, bits=4)  # type: ignore[attr-defined]  # mlx.nn's stubs omit it
    assert install(model)
    if blas_in_use().small_kernels:  # MLX's own quantized products: not read by the pass
        assert "left on MLX's products" in (_by_name(model)[name] or "")
        assert host_weights.install(model) > 0
    assert (_by_name(model)[name] is None) == blas_in_use().small_kernels
    for quantized in (True, False):
        brain = tiny_llama()
        brain.set_dtype(mx.bfloat16)
        if quantized:
            nn.quantize(brain, group_size=64, bits=4)  # type: ignore[attr-defined]  # mlx.nn's stubs omit it
        assert install(brain)
        if blas_in_use().small_kernels:  # until our products are installed
            why = "left on MLX's products" if quantized else "bfloat16"
            assert why in (_by_name(brain)[name] or "")
            assert host_weights.install(brain) > 0
            assert _by_name(brain)[name] is None


@pytest.mark.parametrize("family", ["llama3", "qwen2", "qwen3"])
def test_each_llama_bodied_family_gets_the_paths_llama_gets(family: str) -> None:
    """Llama 3 RoPE scaling, Qwen2's biases and Qwen3's q/k norms are computed on every
    fast path now (their exactness: test_host_pass, test_layer_slice)."""
    model = tiny_family(family)
    assert install(model)
    found = _by_name(model)
    assert found["host softmax attention (ADR 0008)"] is None
    assert found["prompt chunks ride decode steps (ADR 0009)"] is None
    assert found["long prompts sliced between decode steps (ADR 0009)"] is None
    host = found["host pass for small passes (ADR 0013)"]
    assert (host is None) == blas_in_use().small_kernels, host


def test_a_rope_the_host_pass_does_not_compute_is_named() -> None:
    """Linear RoPE scaling is not in the C pass: the model keeps MLX for small passes."""
    model = tiny_family("llama", rope_scaling={"rope_type": "linear", "factor": 2.0})
    assert install(model)
    why = _by_name(model)["host pass for small passes (ADR 0013)"] or ""
    if blas_in_use().small_kernels:
        assert "linear scaling 0.5" in why


def test_a_bfloat16_model_is_told_its_attention_runs_on_mlx() -> None:
    """The wrapper is installed (riding and slicing go through it), but the host softmax
    itself runs on float32 only: the report must not say it runs."""
    model = tiny_family("qwen3")
    model.update(tree_map(lambda p: p.astype(mx.bfloat16), model.parameters()))
    assert install(model)
    found = _by_name(model)
    assert "bfloat16 activations" in (found["host softmax attention (ADR 0008)"] or "")
    assert "not installed" in (found["host pass for small passes (ADR 0013)"] or "")
    assert found["long prompts sliced between decode steps (ADR 0009)"] is None


_SHIM = BlasStatus("OpenBLAS", "/lib/libopenblas.so.0", True, shim=True, compiler="gcc 12.2.0")
_KERNELS = replace(_SHIM, small_kernels=True)
_X86_AVX512 = frozenset({"avx2", "fma", "avx512f"})
_X86_AVX2 = frozenset({"avx2", "fma"})
_ARM64 = frozenset({"asimd", "fp"})
_BASELINE = {"SEMANTIC_CPU_VARIANT": "baseline"}


@pytest.mark.parametrize(
    ("blas", "machine", "flags", "environ", "said"),
    [
        (_KERNELS, "x86_64", _X86_AVX512, {}, None),
        (_KERNELS, "x86_64", _X86_AVX2, {}, None),
        (_KERNELS, "aarch64", _ARM64, {}, None),
        (_SHIM, "x86_64", frozenset({"avx", "sse4_2"}), {}, "no AVX2 + FMA, AVX-512 or NEON"),
        (_SHIM, "riscv64", frozenset(), {}, "on this riscv64 CPU"),
        (_SHIM, "x86_64", _X86_AVX512, _BASELINE, "SEMANTIC_CPU_VARIANT=baseline"),
        (
            replace(_SHIM, compiler="clang 14.0.6"),
            "x86_64",
            _X86_AVX2,
            {},
            "this CPU runs avx2 but clang 14.0.6 built the kernels without fused multiply-add",
        ),
        (
            replace(_SHIM, shim=False),
            "x86_64",
            _X86_AVX512,
            {"SEMANTIC_BLAS_SHIM": "0"},
            "SEMANTIC_BLAS_SHIM=0",
        ),
        (replace(_SHIM, shim=False), "x86_64", _X86_AVX512, {}, "the shim did not build"),
        (BlasStatus("reference BLAS", None, False), "aarch64", frozenset(), {}, "needs OpenBLAS"),
    ],
)
def test_the_small_kernels_run_on_every_variant_and_say_why_not_where_none_fits(
    blas: BlasStatus,
    machine: str,
    flags: frozenset[str],
    environ: dict[str, str],
    said: str | None,
) -> None:
    """Issue 44: AVX-512, AVX2 + FMA and NEON all run the kernels; an x86 CPU without FMA,
    another architecture, the baseline asked for by name and a compiler that built the
    kernels without this CPU's vector units each get a reason in the log and the models
    API (the shim's sgemv path runs)."""
    why = kernels_obstacle(blas, machine, flags, environ)
    if said is None:
        assert why is None
    else:
        assert why is not None
        assert said in why


def test_weights_moved_onto_huge_pages_compute_what_they_did() -> None:
    from semantic.adapters.mlx.cpu.page_placement import place_weights

    model = tiny_llama(seed=3)
    prompt = mx.array([[1, 5, 9, 200, 7]])
    before = model(prompt)
    mx.eval(before)
    pages = place_weights(model)
    if huge_pages_expected():  # its last page may reach past the heap: a few MB in all
        assert pages.huge_bytes > 0, pages.describe()
    assert mx.array_equal(model(prompt), before).item()
