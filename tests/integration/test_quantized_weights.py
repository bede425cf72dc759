"""4-bit, 8-bit and bfloat16 weights on our kernels (native/weights.h, ADR 0031), against
MLX's own and against their float32 copies."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from mlx import nn
from mlx.utils import tree_flatten, tree_map
from mlx_lm.models.cache import KVCache

from semantic.adapters.mlx.accelerator import Group
from semantic.adapters.mlx.cpu import host_weights
from semantic.adapters.mlx.cpu.attention import install as install_attention
from semantic.adapters.mlx.cpu.host_pass import HostPass
from semantic.adapters.mlx.cpu.host_twins import (
    HostBfloat16Embedding,
    HostBfloat16Linear,
    HostQuantizedEmbedding,
    HostQuantizedLinear,
)
from semantic.adapters.mlx.cpu.llama_native import native_library
from semantic.adapters.mlx.cpu.weight_structs import HostWeight, product, table_rows
from tests.helpers import tiny_family

TOLERANCE = 5e-4
"""Relative to the largest value: the products differ from MLX's in summation order only."""

pytestmark = pytest.mark.skipif(
    native_library() is None, reason="no host kernels here (no compiler or no FMA)"
)


def quantized_linear(bits: int, out_dims: int = 80, in_dims: int = 96) -> Any:
    mx.random.seed(bits)
    plain = nn.Linear(in_dims, out_dims)  # type: ignore[attr-defined]  # mlx.nn: untyped
    return nn.QuantizedLinear.from_linear(plain, group_size=32, bits=bits)  # type: ignore[attr-defined]  # mlx.nn: untyped


def dequantized(layer: Any) -> Any:
    """The float32 ``Linear`` that ``mx.dequantize`` makes of a quantized one."""
    in_dims, out_dims = layer.weight.shape[1] * 32 // layer.bits, layer.weight.shape[0]
    plain = nn.Linear(in_dims, out_dims, bias="bias" in layer)  # type: ignore[attr-defined]  # mlx.nn: untyped
    plain.weight = mx.dequantize(
        layer.weight, layer.scales, layer.biases, group_size=layer.group_size, bits=layer.bits
    )
    if "bias" in layer:
        plain.bias = layer.bias
    return plain


def close(ours: mx.array, theirs: mx.array) -> bool:
    a, b = np.asarray(ours), np.asarray(theirs)
    return bool(np.abs(a - b).max() <= TOLERANCE * np.abs(b).max())


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("rows", [1, 3, 6, 7, 32])  # each side of the fused reach: 2 to 8 rows
@pytest.mark.parametrize("out_dims", [80, 203])  # output rows in fours and twos, and not
def test_a_quantized_product_is_the_float32_product_of_its_dequantized_weights(
    bits: int, rows: int, out_dims: int
) -> None:
    layer = quantized_linear(bits, out_dims)
    x = mx.random.normal((rows, 96))
    ours = product(HostWeight.of(layer), x, layer.bias)
    plain = dequantized(layer)
    theirs = product(HostWeight.of(plain), x, plain.bias)
    assert np.array_equal(np.asarray(ours), np.asarray(theirs))
    assert close(ours, layer(x))  # MLX's quantized matmul


def test_a_4_bit_twin_holds_its_words_in_pair_order_and_leaves_the_layer_alone() -> None:
    """Byte j of every 32 inputs holds input j (low nibble) and input j + 16 (high): a row
    whose input i has the value i % 16 becomes bytes 0x00, 0x11, ... 0xff, twice."""
    layer = quantized_linear(4, out_dims=1, in_dims=64)
    values = np.arange(64, dtype=np.uint32) % 16
    mlx_order = (values.reshape(8, 8) << (4 * np.arange(8, dtype=np.uint32))).sum(axis=1)
    layer.weight = mx.array(mlx_order.astype(np.uint32).reshape(1, 8))
    twin = HostQuantizedLinear(layer)
    ours = np.asarray(twin.weight).view(np.uint8).reshape(-1)
    assert ours.tolist() == [j | j << 4 for j in range(16)] * 2
    assert np.array_equal(np.asarray(layer.weight), mlx_order.reshape(1, 8))  # its own kept


@pytest.mark.parametrize("bits", [4, 8])
def test_a_row_of_a_quantized_product_is_the_same_bits_alone_and_among_32(bits: int) -> None:
    """Decode steps and the host pass: up to 32 rows, a row's bits never depend on the
    others (the fused loop up to 6 or 8 rows, the dequantized rows on our kernel past that)."""
    weight = HostWeight.of(quantized_linear(bits, out_dims=203))
    x = mx.random.normal((32, 96))
    together = np.asarray(product(weight, x, None))
    for row in (0, 5, 31):
        alone = np.asarray(product(weight, x[row : row + 1], None))
        assert np.array_equal(alone[0], together[row])
    assert np.array_equal(np.asarray(product(weight, x[:6], None)), together[:6])


@pytest.mark.parametrize("bits", [4, 8])
def test_a_prompt_chunk_is_the_float32_product_of_the_dequantized_weights(bits: int) -> None:
    """Past 32 rows the dequantized weights go to OpenBLAS with every row, as a float32
    model's chunk does: the same call, the same bits."""
    layer = quantized_linear(bits, out_dims=200)
    x = mx.random.normal((70, 96))
    ours = product(HostWeight.of(layer), x, layer.bias)
    plain = dequantized(layer)
    theirs = product(HostWeight.of(plain), x, plain.bias)
    assert np.array_equal(np.asarray(ours), np.asarray(theirs))


def test_install_keeps_a_gguf_models_float16_scales_and_swaps_its_quantized_layers() -> None:
    """The scales and biases stay as the file has them (our products read float16), the
    norms are widened; nothing else is held twice."""
    model = tiny_family("llama", seed=3)
    nn.quantize(model, group_size=32, bits=4)  # type: ignore[attr-defined]  # mlx.nn's stubs omit it
    narrow = tree_map(
        lambda p: p.astype(mx.float16) if p.dtype == mx.float32 else p, model.parameters()
    )
    model.update(narrow)
    assert host_weights.products_obstacle(model) == "not installed"
    swapped = host_weights.install(model)
    assert host_weights.products_obstacle(model) is None
    layers = [m for _, m in model.named_modules() if isinstance(m, nn.QuantizedLinear)]  # type: ignore[attr-defined]  # mlx.nn
    assert swapped == len(layers) + 1  # and the quantized embedding, the tied head
    assert all(type(m) is HostQuantizedLinear for m in layers)
    assert type(model.model.embed_tokens) is HostQuantizedEmbedding
    parameters: Any = tree_flatten(model.parameters())  # (path, array) pairs
    groups = {a.dtype for k, a in parameters if k.endswith(("scales", "biases"))}
    assert groups == {mx.float16}
    others = {a.dtype for k, a in parameters if not k.endswith(("scales", "biases"))}
    assert others <= {mx.float32, mx.uint32}
    gate = model.model.layers[0].mlp.gate_proj
    assert HostWeight.of(gate).struct.scales == np.asarray(gate.scales).ctypes.data


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16])
def test_narrow_scales_read_as_they_are_give_the_bits_of_their_float32_widening(
    dtype: Any,
) -> None:
    """Each scale and bias widened as it is read: products, embedding rows and the tied
    head equal those of the same model whose scales were widened to float32 at load."""
    pair = []
    for widen in (False, True):
        model = tiny_family("llama", seed=3)
        nn.quantize(model, group_size=32, bits=4)  # type: ignore[attr-defined]  # mlx.nn's stubs omit it
        narrow = tree_map(
            lambda p: p.astype(dtype) if p.dtype == mx.float32 else p, model.parameters()
        )
        model.update(narrow)
        if widen:
            model.update(
                tree_map(
                    lambda p: p.astype(mx.float32) if p.dtype == dtype else p, model.parameters()
                )
            )
        assert host_weights.install(model) > 0
        pair.append(model)
    kept, widened = pair
    assert kept.model.layers[0].mlp.gate_proj.scales.dtype == dtype
    assert widened.model.layers[0].mlp.gate_proj.scales.dtype == mx.float32
    x = mx.random.normal((5, 64), key=mx.random.key(1))
    tokens = mx.array([[3, 17, 250, 9]])
    for ours, theirs in (
        (kept.model.layers[0].mlp.gate_proj(x), widened.model.layers[0].mlp.gate_proj(x)),
        (kept.model.embed_tokens(tokens), widened.model.embed_tokens(tokens)),
        (kept.model.embed_tokens.as_linear(x), widened.model.embed_tokens.as_linear(x)),
    ):
        assert ours.dtype == mx.float32
        assert np.array_equal(np.asarray(ours), np.asarray(theirs))


def test_a_model_with_one_layer_our_product_cannot_read_is_left_to_mlx_whole() -> None:
    """All or none: its fingerprint names our products only when every layer runs them."""
    model = tiny_family("llama", seed=3)
    nn.quantize(model, group_size=32, bits=4)  # type: ignore[attr-defined]  # mlx.nn's stubs omit it
    mlp = model.model.layers[1].mlp
    plain = nn.Linear(128, 64, bias=False)  # type: ignore[attr-defined]  # mlx.nn: untyped
    mlp.down_proj = nn.QuantizedLinear.from_linear(plain, group_size=32, bits=3)  # type: ignore[attr-defined]  # mlx.nn: untyped
    assert host_weights.install(model) == 0
    assert not any(isinstance(m, HostQuantizedLinear) for _, m in model.named_modules())
    assert "3-bit" in (host_weights.products_obstacle(model) or "")


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16])
def test_narrow_scales_past_one_block_of_groups_in_every_path(dtype: Any) -> None:
    """72 groups a row (more than the 64 widened at a time, and not a multiple of 16), in
    the fused loop (1 and 3 rows), the scratch path (16) and blocks for OpenBLAS (40):
    each the bits of the float32 product over the layer ``mx.dequantize`` makes with its
    scales widened (the reference reads no group through our code)."""
    layer = quantized_linear(4, out_dims=40, in_dims=72 * 32)
    layer.scales, layer.biases = (
        a.astype(dtype).astype(mx.float32) for a in (layer.scales, layer.biases)
    )
    reference = dequantized(layer)
    narrow = HostQuantizedLinear(layer)
    narrow.scales, narrow.biases = (a.astype(dtype) for a in (layer.scales, layer.biases))
    narrow._host = HostWeight.of(narrow)  # noqa: SLF001 - the struct over the narrow arrays
    assert narrow.scales.dtype == dtype
    for rows in (1, 3, 16, 40):
        x = mx.random.normal((rows, 72 * 32), key=mx.random.key(rows))
        assert np.array_equal(np.asarray(narrow(x)), np.asarray(reference(x)))


def test_install_leaves_float32_and_float16_models_alone() -> None:
    for dtype in (mx.float32, mx.float16):
        model = tiny_family("llama", seed=3)
        model.set_dtype(dtype)
        assert host_weights.install(model) == 0
        why = host_weights.products_obstacle(model)
        assert why == "no bfloat16 or 4/8-bit layers in this model"


def bfloat16_linear(out_dims: int = 80, in_dims: int = 96) -> Any:
    mx.random.seed(16)
    layer = nn.Linear(in_dims, out_dims)  # type: ignore[attr-defined]  # mlx.nn: untyped
    layer.set_dtype(mx.bfloat16)
    return layer


def widened(layer: Any) -> Any:
    plain = nn.Linear(layer.weight.shape[1], layer.weight.shape[0])  # type: ignore[attr-defined]  # mlx.nn: untyped
    plain.weight, plain.bias = layer.weight.astype(mx.float32), layer.bias.astype(mx.float32)
    return plain


@pytest.mark.parametrize("rows", [1, 3, 12, 70])
@pytest.mark.parametrize("out_dims", [80, 203])
def test_a_bfloat16_product_is_the_float32_product_of_its_widened_weights(
    rows: int, out_dims: int
) -> None:
    """Every path (the fused loop, rows dequantized into scratch, blocks for OpenBLAS)
    widens bfloat16 exactly; MLX's own bfloat16 matmul rounds its inputs and output."""
    layer = bfloat16_linear(out_dims)
    plain = widened(layer)
    x = mx.random.normal((rows, 96))
    ours = product(HostWeight.of(layer), x, plain.bias)
    same = product(HostWeight.of(plain), x, plain.bias)
    assert np.array_equal(np.asarray(ours), np.asarray(same))
    theirs = layer(x.astype(mx.bfloat16)).astype(mx.float32)
    assert np.abs(np.asarray(ours - theirs)).max() <= 2**-7 * np.abs(np.asarray(ours)).max()


def test_install_swaps_a_bfloat16_models_layers_and_widens_the_rest() -> None:
    """Norms and biases become float32; the weights stay bfloat16, read where MLX keeps
    them (no float32 copy); a quantized model with bfloat16 scales is installed too, its
    scales as they are."""
    model = tiny_family("qwen2", seed=3)  # biases too
    model.set_dtype(mx.bfloat16)
    assert host_weights.install(model) == 7 * 2 + 1  # two layers' linears and the embedding
    assert host_weights.products_obstacle(model) is None
    linears = [m for _, m in model.named_modules() if isinstance(m, nn.Linear)]  # type: ignore[attr-defined]  # mlx.nn
    assert all(type(m) is HostBfloat16Linear and m.weight.dtype == mx.bfloat16 for m in linears)
    assert type(model.model.embed_tokens) is HostBfloat16Embedding
    weights = {id(m.weight) for m in [*linears, model.model.embed_tokens]}
    parameters: Any = tree_flatten(model.parameters())  # (path, array) pairs
    assert all(a.dtype == mx.float32 for _, a in parameters if id(a) not in weights)
    gate = model.model.layers[0].mlp.gate_proj
    assert HostWeight.of(gate).struct.data == np.asarray(gate.weight.view(mx.uint16)).ctypes.data
    scaled = tiny_family("llama", seed=3)
    scaled.set_dtype(mx.bfloat16)
    nn.quantize(scaled, group_size=64, bits=4)  # type: ignore[attr-defined]  # mlx.nn's stubs omit it
    assert host_weights.install(scaled) > 0
    assert scaled.model.layers[0].mlp.down_proj.scales.dtype == mx.bfloat16  # read as it is


def quantized_family(family: str, bits: int) -> tuple[Any, Any]:
    """The same random model twice: as MLX runs it, and with our products installed."""
    pair = []
    for _ in range(2):
        model = tiny_family(family, seed=5)
        nn.quantize(model, group_size=32, bits=bits)  # type: ignore[attr-defined]  # mlx.nn's stubs omit it
        assert install_attention(model)
        pair.append(model)
    assert host_weights.install(pair[1]) > 0
    return pair[0], pair[1]


def fresh_caches(model: Any) -> list[Any]:
    return [KVCache() for _ in model.model.layers]  # type: ignore[no-untyped-call]  # mlx-lm


def tokens(seed: int, count: int) -> mx.array:
    return mx.array([[int(t) for t in np.random.default_rng(seed).integers(1, 512, count)]])


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_each_llama_bodied_family_runs_quantized_on_the_host_as_mlx_does(
    family: str, bits: int
) -> None:
    """A prompt on MLX's graph with our products, then a chunk and a decode step in the C
    pass: close to mlx-lm's forward with MLX's quantized matmul, the logits too."""
    theirs_model, ours_model = quantized_family(family, bits)
    host = HostPass.of(ours_model)
    assert host is not None
    theirs, ours = fresh_caches(theirs_model), fresh_caches(ours_model)
    prefix = tokens(1, 40)
    assert close(ours_model.model(prefix, cache=ours), theirs_model.model(prefix, cache=theirs))
    for step in (tokens(2, 7), mx.array([[42]])):
        expected = theirs_model.model(step, cache=theirs)
        got = host.hidden([Group(step, ours)])
        assert got is not None
        assert close(got[0], expected)
        head = ours_model.model.embed_tokens.as_linear(got[0])
        assert close(head, theirs_model.model.embed_tokens.as_linear(expected))
    assert close(ours[1].keys[..., :48, :], theirs[1].keys[..., :48, :])


def test_a_4_bit_model_on_the_host_computes_the_bits_of_its_dequantized_copy() -> None:
    """Dequantization rounds as ``mx.dequantize`` does, and the product is the float32
    one: a 4-bit model served here is its float32 copy, faster (its words in our order are
    the same weights as MLX's: the copy is made from MLX's)."""
    as_mlx_has_it, quantized = quantized_family("llama", 4)
    plain = tiny_family("llama", seed=5)
    assert install_attention(plain)
    plain_layers = dict(plain.named_modules())
    for name, layer in as_mlx_has_it.named_modules():
        if isinstance(layer, nn.QuantizedLinear):  # type: ignore[attr-defined]  # mlx.nn
            plain_layers[name].weight = dequantized(layer).weight
    embedding = as_mlx_has_it.model.embed_tokens
    plain.model.embed_tokens.weight = mx.dequantize(
        embedding.weight, embedding.scales, embedding.biases, group_size=32, bits=4
    )
    results = []
    for model in (quantized, plain):
        host = HostPass.of(model)
        assert host is not None
        caches = fresh_caches(model)
        hidden = [host.hidden([Group(step, caches)]) for step in (tokens(3, 30), tokens(4, 1))]
        results.append([np.asarray(h[0]) for h in hidden if h is not None])
    assert len(results[0]) == 2
    for ours, theirs in zip(*results, strict=True):
        assert np.array_equal(ours, theirs)


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_a_bfloat16_model_on_the_host_computes_the_bits_of_its_float32_copy(family: str) -> None:
    """A prompt on MLX's graph, a chunk and a decode step in the C pass: the same bits
    and the same float32 KV as the float32 model of the same (widened) weights."""
    results = []
    for dtype in (mx.bfloat16, mx.float32):
        model = tiny_family(family, seed=5)
        model.set_dtype(mx.bfloat16)
        model.set_dtype(dtype)  # the float32 copy of the same bfloat16 weights
        assert install_attention(model)
        assert host_weights.install(model) == (15 if dtype == mx.bfloat16 else 0)
        host = HostPass.of(model)
        assert host is not None
        caches = fresh_caches(model)
        hidden = [model.model(tokens(3, 40), cache=caches)]
        for step in (tokens(4, 5), tokens(5, 1)):
            rows = host.hidden([Group(step, caches)])
            assert rows is not None
            hidden.append(rows[0])
        assert caches[0].keys.dtype == mx.float32
        results.append([np.asarray(h) for h in (*hidden, caches[1].keys)])
    for ours, theirs in zip(*results, strict=True):
        assert np.array_equal(ours, theirs)


@pytest.mark.parametrize("kind", ["q4", "q8", "bf16"])
def test_a_pass_reads_an_embeddings_rows_as_its_own_module_computes_them(kind: str) -> None:
    """The host pass takes its input rows from ``table_rows`` (our C), not MLX's graph; they
    are the rows MLX's own module gives (a 4-bit twin's words rearranged, the same values),
    and the twin's own lookup gives them too."""
    mx.random.seed(7)
    plain = nn.Embedding(300, 96)  # type: ignore[attr-defined]  # mlx.nn: untyped
    if kind == "bf16":
        plain.weight = plain.weight.astype(mx.bfloat16)
        as_mlx_has_it: Any = plain
        twin: Any = HostBfloat16Embedding(plain)
    else:
        bits = 4 if kind == "q4" else 8
        as_mlx_has_it = nn.QuantizedEmbedding.from_embedding(plain, 32, bits)  # type: ignore[attr-defined]  # mlx.nn: untyped
        twin = HostQuantizedEmbedding(as_mlx_has_it)
    ids = np.array([0, 5, 299, 5, 17])
    host = host_weights.table_of(twin)
    assert host is not None
    ours = table_rows(host, ids)
    assert np.array_equal(ours, np.asarray(as_mlx_has_it(mx.array(ids)).astype(mx.float32)))
    assert np.array_equal(ours, np.asarray(twin(mx.array(ids))))
    assert host_weights.table_of(plain) is None
    with pytest.raises(IndexError):
        table_rows(host, np.array([3, 300]))
