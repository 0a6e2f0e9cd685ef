"""Bit-exact check of winnow's dequantisation against gguf-py (what transformers uses).

Needs WINNOW_BIN (path to the built `winnow` binary); the model-file check also needs
WINNOW_MODEL. Each case writes a small GGUF with GGUFWriter, dumps a tensor through
`winnow inspect --dump-tensor` and compares the float32 bits with gguf.quants.dequantize.
"""

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402
from gguf.quants import dequantize, quantize  # noqa: E402

WINNOW_BIN = os.environ.get("WINNOW_BIN")
needs_bin = pytest.mark.skipif(
    not WINNOW_BIN or not Path(WINNOW_BIN).exists(), reason="WINNOW_BIN not set or missing"
)

# Byte offsets of the fp16 scale fields in each block of the types gguf-py cannot quantize.
# Random bytes there could be inf/NaN, which would make a bit comparison meaningless.
K_QUANT_HALF_OFFSETS = {
    T.Q2_K: [80, 82],
    T.Q3_K: [108],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
}

QUANTIZABLE = [T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1]


def run_dump(model: Path, name: str) -> np.ndarray:
    proc = subprocess.run(
        [WINNOW_BIN, "inspect", "--model", str(model), "--dump-tensor", name],
        capture_output=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    text = proc.stdout.decode().strip()
    assert text.startswith("[") and text.endswith("]"), text[:200]
    # A text parse straight to floats: json would turn "-0" into the integer 0 (losing the sign
    # bit) and is far slower on the 28M-value embedding table.
    values = np.fromstring(text[1:-1], sep=",", dtype=np.float64)
    return values.astype(np.float32)


def assert_bits_equal(got: np.ndarray, want: np.ndarray) -> None:
    want = np.ascontiguousarray(want, dtype=np.float32).reshape(-1)
    assert got.shape == want.shape
    mismatch = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    assert mismatch.size == 0, (
        f"{mismatch.size} mismatches, first at {mismatch[0]}: "
        f"{got[mismatch[0]]!r} vs {want[mismatch[0]]!r}"
    )


def random_k_blocks(qtype: T, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    _, type_size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    for off in K_QUANT_HALF_OFFSETS[qtype]:
        raw[:, off + 1] &= 0xBF  # clear the top exponent bit: |scale| < 2, always finite
    return raw


def write_gguf(path: Path, tensors: dict[str, tuple[np.ndarray, T]]) -> None:
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_uint32("test.marker", 7)
    for name, (data, qtype) in tensors.items():
        if qtype in (T.F32, T.F16):
            writer.add_tensor(name, data)
        else:
            writer.add_tensor(name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@needs_bin
@pytest.mark.parametrize("qtype", QUANTIZABLE + list(K_QUANT_HALF_OFFSETS), ids=lambda t: t.name)
def test_matches_gguf_py(tmp_path: Path, qtype: T) -> None:
    rng = np.random.default_rng(int(qtype))
    block_size, _ = gguf.GGML_QUANT_SIZES[qtype]
    rows, cols = 3, max(block_size, 32) * 2
    if qtype in K_QUANT_HALF_OFFSETS:
        stored = random_k_blocks(qtype, rows * cols // block_size, rng).reshape(rows, -1)
    else:
        values = (rng.standard_normal((rows, cols)) * 2.5).astype(np.float32)
        values[0, :5] = [0.0, -0.0, 1e-6, -65504.0, 3.0]
        stored = quantize(values, qtype)
    # A second tensor after the first exercises non-zero data offsets.
    tiny = np.array([[1.5, -2.25]], dtype=np.float32)
    model = tmp_path / f"{qtype.name}.gguf"
    write_gguf(model, {"pad": (tiny, T.F32), "w": (stored, qtype)})

    got = run_dump(model, "w")
    want = dequantize(stored, qtype)
    assert_bits_equal(got, want)
    assert_bits_equal(run_dump(model, "pad"), tiny)


@needs_bin
def test_default_model_one_tensor_per_type() -> None:
    model = os.environ.get("WINNOW_MODEL")
    if not model or not Path(model).exists():
        pytest.skip("WINNOW_MODEL not set or missing")
    reader = gguf.GGUFReader(model)
    smallest: dict[int, object] = {}
    for t in reader.tensors:
        cur = smallest.get(t.tensor_type)
        if cur is None or t.n_bytes < cur.n_bytes:
            smallest[t.tensor_type] = t
    assert smallest, "model has no tensors"
    for tensor_type, t in smallest.items():
        got = run_dump(Path(model), t.name)
        want = dequantize(t.data, tensor_type)
        assert_bits_equal(got, want)
