"""--cpu-weight-type's quantiser against gguf-py's (gguf.quants.quantize, the numpy reference
that is bit-exact with ggml's quantize_row_*_ref): byte-identical blocks.

build/quantize_rows (tests/tools/quantize_rows.cc, beside WINNOW_BIN) quantises float32 rows
with kernels::QuantizeMatrix, rows spread over a thread pool as at load. Rows: random at many
scales, real weights (the default model's, dequantised), exact rounding ties, zeros, values
whose fp16 scale overflows, subnormals and tiny normals (whose 1 / d overflows). Where numpy's
bytes are not defined by the arithmetic (kernels/cpu/quantize.h: NaN casts, the sign of a zero
minimum) the dequantised values are compared instead.
tests/python/test_hf_model.py runs quantised directories against transformers.
"""
from __future__ import annotations

import subprocess

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402
from gguf.quants import dequantize, quantize  # noqa: E402

TYPES = {"q8_0": T.Q8_0, "q4_0": T.Q4_0, "q4_1": T.Q4_1, "q5_0": T.Q5_0, "q5_1": T.Q5_1}
BLOCK = 32


@pytest.fixture(scope="module")
def tool(winnow_bin):
    path = winnow_bin.parent / "quantize_rows"
    if not path.exists():
        pytest.fail(f"{path} not found; build it (`ninja quantize_rows`, part of `make build`)")
    return path


def ours(tool, name: str, rows: np.ndarray, threads: int = 3) -> np.ndarray:
    rows = np.ascontiguousarray(rows, dtype="<f4")
    proc = subprocess.run([str(tool), name, str(rows.shape[0]), str(rows.shape[1]), str(threads)],
                          input=rows.tobytes(), capture_output=True, check=False)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    return np.frombuffer(proc.stdout, dtype=np.uint8).reshape(rows.shape[0], -1)


def reference(name: str, rows: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):  # the tiny cases divide by zero and cast NaN on purpose
        return quantize(np.ascontiguousarray(rows, dtype=np.float32), TYPES[name])


def dequantized_bits(name: str, blocks: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        values = dequantize(blocks, TYPES[name]).astype(np.float32)
    return np.where(values == 0, np.float32(0), values).view(np.uint32)  # +0 and -0 alike


def assert_identical(tool, name: str, rows: np.ndarray) -> None:
    got, want = ours(tool, name, rows), reference(name, rows)
    assert got.shape == want.shape
    diff = np.argwhere(got != want)
    assert diff.size == 0, (f"{name}: {len(diff)} bytes differ, first at (row, byte) "
                            f"{diff[0].tolist()}: {got[tuple(diff[0])]} vs {want[tuple(diff[0])]}")


def rows_of(rng: np.random.Generator, scale: float, n: int = 24, cols: int = 256) -> np.ndarray:
    return (rng.standard_normal((n, cols)) * scale).astype(np.float32)


@pytest.mark.parametrize("name", TYPES)
def test_random_rows_are_byte_identical(tool, name):
    rng = np.random.default_rng(31)
    for scale in (0.02, 1.0, 300.0):
        assert_identical(tool, name, rows_of(rng, scale))
    # Every block at its own scale, from 1e-9 to 1e9, with outliers.
    scales = np.repeat(np.exp(rng.uniform(-20, 20, (32, 512 // BLOCK))), BLOCK, axis=1)
    wide = (rng.standard_normal((32, 512)) * scales).astype(np.float32)
    spiky = rows_of(rng, 0.02)
    spiky[rng.random(spiky.shape) < 0.01] *= 200
    assert_identical(tool, name, wide)
    assert_identical(tool, name, spiky)
    assert_identical(tool, name, np.abs(rows_of(rng, 1.0)))  # one-signed: min or max is 0-ish


@pytest.mark.parametrize("name", TYPES)
def test_rounding_ties_are_byte_identical(tool, name):
    """Values on exact halves of the step: Q8_0 rounds them away from zero, the truncating
    types' x / d + 0.5 lands on integers."""
    rng = np.random.default_rng(7)
    halves = rng.integers(-254, 255, size=(16, 128)).astype(np.float32) / 2
    halves[:, ::BLOCK] = 127  # max |x| = 127: Q8_0's d is exactly 1
    assert_identical(tool, name, halves)
    grid = rng.integers(0, 16, size=(16, 128)).astype(np.float32) * 0.25 - 2
    assert_identical(tool, name, grid)


@pytest.fixture(scope="module")
def real_rows(model_path):
    """64 rows each of three of the default model's tensors, dequantised, as float32 and as a
    bf16 checkpoint holds them."""
    tensors = {t.name: t for t in gguf.GGUFReader(str(model_path)).tensors}
    out = []
    for tensor_name in ("blk.0.attn_q.weight", "blk.5.ffn_down.weight", "token_embd.weight"):
        t = tensors[tensor_name]
        rows = dequantize(np.asarray(t.data)[:64], t.tensor_type).astype(np.float32)
        bits = rows.view(np.uint32)
        bf16 = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16  # round to nearest even
        out += [rows, bf16.astype(np.uint32).view(np.float32)]
    return out


@pytest.mark.parametrize("name", TYPES)
def test_real_weights_are_byte_identical(tool, name, real_rows):
    for rows in real_rows:
        assert_identical(tool, name, rows)


@pytest.mark.parametrize("name", TYPES)
def test_edge_values(tool, name):
    rng = np.random.default_rng(3)
    zeros = np.zeros((4, 64), np.float32)
    one_hot = np.zeros((4, 64), np.float32)
    one_hot[:, 5] = -3.0
    one_hot[:, 40] = 1e-3
    huge = rows_of(rng, 1e30, 8, 64)  # the fp16 scale overflows to inf, as in ggml
    for rows in (zeros, one_hot, huge):
        assert_identical(tool, name, rows)
    # Subnormal and tiny normal blocks: 1 / d overflows (|d| < 2^-128), numpy casts NaN / inf
    # (undefined in C); the fp16 scale is 0, so only the dequantised values are defined.
    for scale in (1e-40, 1e-37, 1e-30):
        rows = rows_of(rng, scale, 8, 64)
        got, want = ours(tool, name, rows), reference(name, rows)
        assert np.array_equal(dequantized_bits(name, got), dequantized_bits(name, want)), scale
        assert np.array_equal(got[:, :2], want[:, :2]), scale  # the scale itself: defined


@pytest.mark.parametrize("name", ["q4_1", "q5_1"])
def test_mixed_sign_zeros(tool, name):
    """A block of +0 and -0: which zero numpy's min reduction returns depends on its SIMD lanes;
    only the sign bit of the minimum's fp16 may differ, and the values dequantise alike."""
    rng = np.random.default_rng(11)
    rows = np.where(rng.random((16, 64)) < 0.5, -0.0, 0.0).astype(np.float32)
    got, want = ours(tool, name, rows), reference(name, rows)
    assert np.array_equal(dequantized_bits(name, got), dequantized_bits(name, want))
    min_sign = np.zeros(got.shape[1], dtype=np.uint8)
    block_bytes = got.shape[1] // 2
    min_sign[[3, block_bytes + 3]] = 0x80  # the high byte of each block's fp16 minimum
    assert np.array_equal(got & ~min_sign, want & ~min_sign)


def test_threads_do_not_change_the_bytes(tool):
    rows = rows_of(np.random.default_rng(5), 0.05, n=97, cols=96)
    for name in TYPES:
        one = ours(tool, name, rows, threads=1)
        assert np.array_equal(one, ours(tool, name, rows, threads=4)), name


def test_unknown_type_is_refused_naming_the_flag(winnow_bin):
    for command in (["score", "--tokens-file", "x.json"], ["serve"]):
        proc = subprocess.run([str(winnow_bin), *command, "--cpu-weight-type", "q4_k"],
                              capture_output=True, text=True, check=False)
        assert proc.returncode == 2, command
        assert "--cpu-weight-type" in proc.stderr, proc.stderr
        assert "must be one of none, q8_0, q4_0, q4_1, q5_0, q5_1" in proc.stderr, proc.stderr
