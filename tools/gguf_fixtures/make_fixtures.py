#!/usr/bin/env python3
"""Fixtures for runtime/gguf (the GGUF reader): small GGUF files written by the `gguf` Python
package's GGUFWriter, and what the same package's GGUFReader reads back from them
(tests/runtime/test_gguf.cpp checks that our reader gives the same metadata and tensor bytes).

Made with gguf==0.19.0 and numpy (Python 3). Run by hand; to regenerate:

    python3 -m venv /tmp/gguf-venv && /tmp/gguf-venv/bin/pip install gguf==0.19.0
    /tmp/gguf-venv/bin/python tools/gguf_fixtures/make_fixtures.py

It writes into tests/runtime/fixtures/gguf/:
    all_types.gguf    metadata of every value type (each scalar type, strings, arrays of each
                      scalar type and of strings, an array of arrays), tensors of F32 (1 to 4
                      dimensions), F16, Q8_0 and Q4_0, the default alignment (32)
    aligned64.gguf    general.alignment = 64, tensors of F32, Q8_0 and Q4_0
    expected.json     per file: version, alignment, data offset, each key's type and value, each
                      tensor's type, dims (ggml order), offset in the data section, byte size and
                      bytes (hex), as GGUFReader reads them
and copies the .gguf files into tests/fuzz/corpus/gguf/ as the fuzzer's seeds.
"""
import json
import os
import shutil

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as V

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
OUT = os.path.join(ROOT, "tests", "runtime", "fixtures", "gguf")
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus", "gguf")
rng = np.random.default_rng(20261128)
# GGUFReader flattens an array of arrays: its expected value is the list written.
NESTED = [[1, 2, 3], [4], [-5, 6]]


def quantized(shape, qtype):
    data = rng.standard_normal(shape).astype(np.float32)
    return gguf.quants.quantize(data, qtype)


def write_all_types(path):
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_name("fixture all types")
    w.add_uint8("test.u8", 250)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 65000)
    w.add_int16("test.i16", -32000)
    w.add_uint32("test.u32", 4000000000)
    w.add_int32("test.i32", -2000000000)
    w.add_uint64("test.u64", 18000000000000000000)
    w.add_int64("test.i64", -9000000000000000000)
    w.add_float32("test.f32", 0.1)
    w.add_float64("test.f64", 2.718281828459045)
    w.add_bool("test.bool_true", True)
    w.add_bool("test.bool_false", False)
    w.add_string("test.string", "héllo, wörld ✓ 日本")
    w.add_string("test.empty_string", "")
    for name, vt, values in [
        ("u8", V.UINT8, [0, 1, 255]),
        ("i8", V.INT8, [-128, 0, 127]),
        ("u16", V.UINT16, [0, 65535]),
        ("i16", V.INT16, [-32768, 32767]),
        ("u32", V.UINT32, [0, 4294967295, 7]),
        ("i32", V.INT32, [-2147483648, 2147483647, -1]),
        ("u64", V.UINT64, [0, 18446744073709551615]),
        ("i64", V.INT64, [-9223372036854775808, 9223372036854775807]),
        ("f32", V.FLOAT32, [0.5, -1.25, 3.0e38]),
        ("f64", V.FLOAT64, [1.0e-300, -0.1]),
        ("bool", V.BOOL, [True, False, True]),
        ("string", V.STRING, ["a", "", "<|im_start|>", "Ġthe"]),
    ]:
        w.add_key_value(f"test.array.{name}", values, V.ARRAY, sub_type=vt)
    w.add_key_value("test.array.nested", NESTED, V.ARRAY, sub_type=V.ARRAY)
    w.add_tensor("t.f32_1d", rng.standard_normal(5).astype(np.float32))
    w.add_tensor("t.f32_2d", rng.standard_normal((3, 4)).astype(np.float32))
    w.add_tensor("t.f32_3d", rng.standard_normal((2, 3, 4)).astype(np.float32))
    w.add_tensor("t.f32_4d", rng.standard_normal((2, 1, 3, 2)).astype(np.float32))
    w.add_tensor("t.f16", rng.standard_normal((2, 8)).astype(np.float16))
    w.add_tensor("t.q8_0", quantized((2, 64), T.Q8_0), raw_dtype=T.Q8_0)
    w.add_tensor("t.q4_0", quantized((3, 32), T.Q4_0), raw_dtype=T.Q4_0)
    finish(w)


def write_aligned64(path):
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_custom_alignment(64)
    w.add_uint32("llama.block_count", 2)
    w.add_tensor("a.f32", rng.standard_normal(3).astype(np.float32))
    w.add_tensor("b.q8_0", quantized((1, 32), T.Q8_0), raw_dtype=T.Q8_0)
    w.add_tensor("c.q4_0", quantized((2, 64), T.Q4_0), raw_dtype=T.Q4_0)
    finish(w)


def finish(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def plain(v):
    if isinstance(v, (np.generic,)):
        v = v.item()
    if isinstance(v, list):
        return [plain(x) for x in v]
    if isinstance(v, float):
        return float(v)
    return v


def describe(path):
    r = gguf.GGUFReader(path)
    out = {"version": None, "alignment": int(r.alignment), "data_offset": int(r.data_offset), "metadata": [], "tensors": []}
    for name, f in r.fields.items():
        if name.startswith("GGUF."):
            if name == "GGUF.version":
                out["version"] = int(f.parts[f.data[0]][0])
            continue
        entry = {"key": name, "type": f.types[0].name.lower()}
        if f.types[0] == V.ARRAY:
            entry["elem_type"] = f.types[1].name.lower()
        entry["value"] = NESTED if name == "test.array.nested" else plain(f.contents())
        out["metadata"].append(entry)
    for t in r.tensors:
        out["tensors"].append({
            "name": t.name,
            "type": int(t.tensor_type),
            "dims": [int(d) for d in t.shape],
            "offset": int(t.data_offset) - int(r.data_offset),
            "nbytes": int(t.n_bytes),
            "hex": bytes(np.asarray(t.data).tobytes()).hex(),
        })
    return out


def main():
    os.makedirs(OUT, exist_ok=True)
    os.makedirs(CORPUS, exist_ok=True)
    expected = {}
    for name, make in [("all_types.gguf", write_all_types), ("aligned64.gguf", write_aligned64)]:
        path = os.path.join(OUT, name)
        make(path)
        expected[name] = describe(path)
        shutil.copy(path, os.path.join(CORPUS, name))
        print(name, os.path.getsize(path), "bytes,", len(expected[name]["tensors"]), "tensors")
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
