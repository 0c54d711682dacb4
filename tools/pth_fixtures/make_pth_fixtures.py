#!/usr/bin/env python3
"""Fixtures for the .pth reader (runtime/pth.h) and its fuzz target. Run by hand, not by CI:

    /work/venv/bin/python tools/pth_fixtures/make_pth_fixtures.py     (torch 2.x, safetensors)

Writes into tests/runtime/fixtures/pth/ (a few KB each; the file names say what they hold):
  state_dict.pth            torch.save of a plain dict: float32/16/bfloat16/64, int64/32/16/8,
                            uint8 and bool tensors, a 0-d tensor, a transposed (non-contiguous)
                            one, two views of one storage at different offsets, a stride-0
                            broadcast, an empty tensor, an nn.Parameter, and one tensor under two
                            names (tied)
  state_dict_p1.pth, state_dict_p4.pth, state_dict_p5.pth
                            the same dict saved with pickle protocols 1, 4 and 5
  state_dict_zip64.pth      the same archive re-packed with zip64 fields in every header (as torch
                            writes them past 4 GiB) and no alignment padding
  state_dict.expected.safetensors   its values, each tensor contiguous (the reference)
  module.pth                the OrderedDict state_dict() of a small nn.Module (Conv2d, LayerNorm,
                            Linear with a running buffer), with its _metadata
  module.expected.safetensors
  nested.pth                {"epoch", "lr", "state_dict": the module's, "optimizer": plain data}
Bad files, each of which the reader must refuse with a message naming the fault:
  truncated.pth (state_dict.pth cut in half), forbidden_global.pth (a pickle that would call
  os.system), compressed.pth (one storage deflated), storage_past_entry.pth (a view reading past
  its storage), storage_size_mismatch.pth (a storage entry shorter than its element count),
  bad_crc.pth (one byte of data.pkl changed), big_endian.pth (byteorder "big"), legacy.pth
  (torch's pre-1.6 format), torchscript.pt (torch.jit.save), random.pth (random bytes).
And the seed corpus of tests/fuzz/corpus/pth/: a few of the files above, and bare data.pkl
pickles (*.pkl) whose storages are all 64 bytes, as tests/fuzz/fuzz_pth.cpp wraps them.
"""
import collections
import io
import os
import pickle
import random
import struct
import zipfile
import zlib
from pathlib import Path

import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "runtime" / "fixtures" / "pth"
CORPUS = ROOT / "tests" / "fuzz" / "corpus" / "pth"


def state_dict():
    g = torch.Generator().manual_seed(7)
    base = torch.arange(10, dtype=torch.float32) * 0.25 - 1.0
    tied = torch.randn(2, 2, generator=g)
    sd = {
        "f32": torch.randn(2, 3, generator=g),
        "f16": torch.randn(4, generator=g).half(),
        "bf16": torch.randn(3, 2, generator=g).bfloat16(),
        "f64": torch.randn(2, 2, generator=g).double(),
        "i64": torch.tensor([-(2**40), -1, 0, 1, 2**62], dtype=torch.int64),
        "i32": torch.tensor([-(2**31), 7, 2**31 - 1], dtype=torch.int32),
        "i16": torch.tensor([-300, 300], dtype=torch.int16),
        "i8": torch.tensor([-128, 5, 127], dtype=torch.int8),
        "u8": torch.tensor([0, 200, 255], dtype=torch.uint8),
        "bool": torch.tensor([True, False, False, True, True, False]),
        "scalar": torch.tensor(3.5),
        "transposed": torch.randn(3, 4, generator=g).t(),
        "view_a": base[2:5],
        "view_b": base[5:9].view(2, 2),
        "broadcast": torch.randn(4, generator=g).expand(3, 4),
        "empty": torch.zeros(0, 3),
        "param": torch.nn.Parameter(torch.randn(2, 3, generator=g)),
        "tied_a": tied,
        "tied_b": tied,
    }
    assert not sd["transposed"].is_contiguous() and sd["view_b"].storage_offset() == 5
    return sd


class SmallModule(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 3, 3, padding=1)
        self.norm = torch.nn.LayerNorm(3)
        self.head = torch.nn.Linear(3, 2)
        self.register_buffer("running", torch.arange(4, dtype=torch.float32))


def expected(sd):
    out = {}
    for k, v in sd.items():
        out[k] = v.detach().clone().contiguous()
    return out


def write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    print(f"{path.relative_to(ROOT)}: {len(data)} bytes")


def saved(obj, **kw):
    buf = io.BytesIO()
    torch.save(obj, buf, **kw)
    return buf.getvalue()


def entries(data):
    z = zipfile.ZipFile(io.BytesIO(data))
    return [(i.filename, z.read(i.filename)) for i in z.infolist()]


def repack(items, deflate=()):
    """A zip of (name, bytes) with Python's zipfile, stored unless the name is in `deflate`."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in items:
            z.writestr(zipfile.ZipInfo(name), data,
                       compress_type=zipfile.ZIP_DEFLATED if name in deflate else zipfile.ZIP_STORED)
    return buf.getvalue()


def repack_zip64(items):
    """A stored zip whose every local and central header carries its sizes (and offset) in the
    zip64 extra field, with a zip64 end-of-directory record and locator."""
    out = bytearray()
    central = bytearray()
    for name, data in items:
        nm = name.encode()
        crc = zlib.crc32(data) & 0xFFFFFFFF
        offset = len(out)
        extra = struct.pack("<HHQQ", 1, 16, len(data), len(data))
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 45, 0, 0, 0, 0x21, crc, 0xFFFFFFFF, 0xFFFFFFFF,
                           len(nm), len(extra)) + nm + extra + data
        cextra = struct.pack("<HHQQQ", 1, 24, len(data), len(data), offset)
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 45, 45, 0, 0, 0, 0x21, crc, 0xFFFFFFFF,
                               0xFFFFFFFF, len(nm), len(cextra), 0, 0, 0, 0, 0xFFFFFFFF) + nm + cextra
    cd_offset = len(out)
    out += central
    z64 = len(out)
    out += struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, len(items), len(items), len(central), cd_offset)
    out += struct.pack("<IIQI", 0x07064B50, 0, z64, 1)
    out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    back = zipfile.ZipFile(io.BytesIO(bytes(out)))
    assert [(i.filename, back.read(i.filename)) for i in back.infolist()] == list(items)
    return bytes(out)


# Hand-made pickles in torch's layout, for storages that lie.
class FakeStorage:
    def __init__(self, key, cls, numel):
        self.key, self.cls, self.numel = key, cls, numel


class FakeTensor:
    def __init__(self, storage, offset, size, stride):
        self.args = (storage, offset, size, stride, False, collections.OrderedDict())

    def __reduce__(self):
        return (torch._utils._rebuild_tensor_v2, self.args)


class TorchLikePickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, FakeStorage):
            return ("storage", obj.cls, obj.key, "cpu", obj.numel)
        return None


def torch_like(obj, storages):
    buf = io.BytesIO()
    TorchLikePickler(buf, protocol=2).dump(obj)
    items = [("archive/data.pkl", buf.getvalue()), ("archive/byteorder", b"little")]
    items += [(f"archive/data/{k}", v) for k, v in storages.items()]
    items.append(("archive/version", b"3\n"))
    return repack(items)


class Evil:
    def __reduce__(self):
        return (os.system, ("echo this must never run",))


def main():
    torch.manual_seed(0)
    sd = state_dict()
    good = saved(sd)
    write(OUT / "state_dict.pth", good)
    for p in (1, 4, 5):
        write(OUT / f"state_dict_p{p}.pth", saved(sd, pickle_protocol=p))
    write(OUT / "state_dict_zip64.pth", repack_zip64(entries(good)))
    save_file(expected(sd), str(OUT / "state_dict.expected.safetensors"))
    print("wrote state_dict.expected.safetensors")

    m = SmallModule()
    with torch.no_grad():
        m.norm.weight.uniform_(0.5, 1.5)
        m.norm.bias.uniform_(-0.5, 0.5)
    msd = m.state_dict()
    assert isinstance(msd, collections.OrderedDict) and hasattr(msd, "_metadata")
    write(OUT / "module.pth", saved(msd))
    save_file(expected(msd), str(OUT / "module.expected.safetensors"))
    print("wrote module.expected.safetensors")
    nested = {"epoch": 3, "lr": 0.5, "name": "small", "flags": (True, None, -7), "state_dict": msd,
              "optimizer": {"state": {}, "param_groups": [{"lr": 0.1, "betas": (0.9, 0.99), "params": [0, 1, 2]}]}}
    write(OUT / "nested.pth", saved(nested))

    # Bad files.
    write(OUT / "truncated.pth", good[: len(good) // 2])
    write(OUT / "forbidden_global.pth", torch_like({"w": Evil()}, {}))
    items = entries(good)
    write(OUT / "compressed.pth", repack(items, deflate={items[0][0].split("/")[0] + "/data/0"}))
    f4 = bytes(range(16))
    write(OUT / "storage_past_entry.pth",
          torch_like({"w": FakeTensor(FakeStorage("0", torch.FloatStorage, 4), 1, (2, 2), (2, 1))}, {"0": f4}))
    write(OUT / "storage_size_mismatch.pth",
          torch_like({"w": FakeTensor(FakeStorage("0", torch.FloatStorage, 8), 0, (8,), (1,))}, {"0": f4}))
    pkl_name = items[0][0]
    assert pkl_name.endswith("/data.pkl")
    bad = bytearray(good)
    at = bad.find(b"transposed")
    assert at > 0
    bad[at] = ord("T")  # a name changed in place: only the CRC notices
    write(OUT / "bad_crc.pth", bytes(bad))
    write(OUT / "big_endian.pth", repack([(n, b"big" if n.endswith("/byteorder") else d) for n, d in items]))
    write(OUT / "legacy.pth", saved({"w": torch.ones(2)}, _use_new_zipfile_serialization=False))
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), buf)
    write(OUT / "torchscript.pt", buf.getvalue())
    write(OUT / "random.pth", random.Random(5).randbytes(512))

    # Fuzz seeds: whole files, and bare pickles whose storages all hold 64 bytes.
    for name in ("state_dict.pth", "module.pth", "nested.pth", "state_dict_zip64.pth"):
        write(CORPUS / name, (OUT / name).read_bytes())
    g = torch.Generator().manual_seed(3)
    f = torch.randn(16, generator=g)
    h = torch.randn(32, generator=g).half()
    b = torch.randn(32, generator=g).bfloat16()
    i = torch.arange(8)
    z = torch.ones(64, dtype=torch.bool)
    small = {"f": f[1:13].view(3, 4).t(), "h": h, "b": b[4:], "i": i[2:], "z": z.view(8, 8)[::2],
             "p": torch.nn.Parameter(f), "s": f[3], "e": torch.zeros(16)[16:]}
    for proto in (2, 4):
        z_items = entries(saved(small, pickle_protocol=proto))
        for n, d in z_items:
            if "/data/" in n:
                assert len(d) == 64, (n, len(d))
        write(CORPUS / f"small_p{proto}.pkl", dict(z_items)[z_items[0][0]])
    nz = entries(saved({"epoch": 1, "model": small, "opt": [1.5, "a", None, (2, -3)]}))
    write(CORPUS / "nested.pkl", dict(nz)[nz[0][0]])


if __name__ == "__main__":
    main()
