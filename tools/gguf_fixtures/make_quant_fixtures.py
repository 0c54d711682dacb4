#!/usr/bin/env python3
"""Fixtures for runtime/gguf_quants: block bytes of each ggml type and the floats that the `gguf`
Python package's gguf.quants.dequantize decodes from them (tests/runtime/test_gguf_quants.cpp
compares ours with them bit for bit).

Made with gguf==0.19.0 and numpy==2.4.6 (Python 3). Run by hand; to regenerate:

    python3 -m venv /tmp/gguf-venv && /tmp/gguf-venv/bin/pip install gguf==0.19.0 numpy==2.4.6
    /tmp/gguf-venv/bin/python tools/gguf_fixtures/make_quant_fixtures.py

It writes into tests/runtime/fixtures/gguf_quants/, per type NAME:
    NAME.blocks  the raw blocks (as a GGUF file stores them)
    NAME.f32     gguf.quants.dequantize of them: float32, little-endian, in order
and sizes.txt: "NAME type_id block_values block_bytes" from gguf.constants.GGML_QUANT_SIZES.

F32, F16, BF16, Q8_0, Q4_0 and Q4_1 are quantized from float data by gguf.quants.quantize:
4 rows of 256 normal values (fixed seed) and rows made for the edges (zeros, a constant row,
magnitudes near fp16's largest, tiny values whose scales are fp16 subnormals, one outlier among
small values, alternating signs). This gguf version cannot quantize Q4_K, Q5_K or Q6_K: their
blocks are random bytes with valid (finite) fp16 scales, plus blocks made for the edges (zero
scales, every 6-bit scale and min at 63, large and subnormal fp16 scales).
"""
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "runtime", "fixtures",
                   "gguf_quants")
ROW = 256
rng = np.random.default_rng(20260528)


def float_rows() -> np.ndarray:
    rows = [rng.standard_normal(ROW).astype(np.float32) for _ in range(4)]
    rows.append(np.zeros(ROW, np.float32))
    rows.append(np.full(ROW, 0.3125, np.float32))
    rows.append((rng.uniform(-1, 1, ROW) * 60000).astype(np.float32))  # near fp16's largest
    rows.append((rng.standard_normal(ROW) * 1e-6).astype(np.float32))  # scales fp16 subnormal
    r = (rng.standard_normal(ROW) * 1e-3).astype(np.float32)
    r[::37] = 250.0  # one outlier per block of 32
    rows.append(r)
    rows.append(np.where(np.arange(ROW) % 2 == 0, 1.0, -1.0).astype(np.float32) *
                np.linspace(0.0, 8.0, ROW, dtype=np.float32))
    return np.stack(rows)


def special_rows() -> np.ndarray:
    """For the float types: signed zeros, infinities, a quiet NaN, subnormals, values that round."""
    r = rng.standard_normal(ROW).astype(np.float32)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-45, 65504.0, 65520.0, 1e5,
                         6e-8, 3e-8, 1.0 + 2.0 ** -11, 3.4e38, -3.4e38, 2.0 ** -24], np.float32)
    r[:len(specials)] = specials
    return r.reshape(1, ROW)


def fp16_bytes(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float16).view(np.uint8).reshape(-1, 2)


def kquant_blocks(qtype: T) -> np.ndarray:
    """Random super-blocks with valid fp16 scales, then blocks for the edges."""
    n = 6
    _, size = GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, size=(n + 4, size), dtype=np.uint8)
    d = np.abs(rng.standard_normal(n + 4) * 0.01)
    dmin = np.abs(rng.standard_normal(n + 4) * 0.01)
    d[n] = dmin[n] = 0.0            # zero scales
    d[n + 1], dmin[n + 1] = 60000.0, 65504.0  # large scales
    d[n + 2], dmin[n + 2] = 6e-8, 1.2e-7     # fp16 subnormal scales
    d[n + 3], dmin[n + 3] = 1.5, -0.75       # negative dmin, all 6-bit scales and mins at 63 (below)
    if qtype == T.Q6_K:
        b[:, -2:] = fp16_bytes(d)
        b[n + 3, 192:208] = np.array([127, -128] * 8, np.int8).view(np.uint8)
    else:  # Q4_K, Q5_K: d, dmin, scales[12], ...
        b[:, 0:2] = fp16_bytes(d)
        b[:, 2:4] = fp16_bytes(dmin)
        b[n + 3, 4:16] = 0xFF
    return b


def write(name: str, qtype: T, blocks: np.ndarray) -> None:
    blocks = np.ascontiguousarray(blocks, np.uint8)
    values = gguf.quants.dequantize(blocks, qtype)
    values = np.ascontiguousarray(values, np.float32)
    block_values, block_bytes = GGML_QUANT_SIZES[qtype]
    assert blocks.size % block_bytes == 0 and values.size == blocks.size // block_bytes * block_values
    with open(os.path.join(OUT, name + ".blocks"), "wb") as f:
        f.write(blocks.tobytes())
    with open(os.path.join(OUT, name + ".f32"), "wb") as f:
        f.write(values.astype("<f4").tobytes())
    print(f"{name}: {values.size} values, {blocks.size} bytes")


def main() -> int:
    os.makedirs(OUT, exist_ok=True)
    data = float_rows()
    floats = np.concatenate([data, special_rows()])
    for name, qtype in [("F32", T.F32), ("F16", T.F16), ("BF16", T.BF16)]:
        q = gguf.quants.quantize(floats, qtype)
        write(name, qtype, q.view(np.uint8).reshape(floats.shape[0], -1))
    for name, qtype in [("Q8_0", T.Q8_0), ("Q4_0", T.Q4_0), ("Q4_1", T.Q4_1)]:
        write(name, qtype, gguf.quants.quantize(data, qtype))
    for name, qtype in [("Q4_K", T.Q4_K), ("Q5_K", T.Q5_K), ("Q6_K", T.Q6_K)]:
        write(name, qtype, kquant_blocks(qtype))
    with open(os.path.join(OUT, "sizes.txt"), "w") as f:
        for name in ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K"]:
            qtype = T[name]
            block_values, block_bytes = GGML_QUANT_SIZES[qtype]
            f.write(f"{name} {int(qtype)} {block_values} {block_bytes}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
