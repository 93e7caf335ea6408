"""Inputs that once broke the loaders' contract (issue 44's fuzz campaign, and what this fuzzer
found since), kept small in tests/fixtures/fuzz/regressions/ with index.json: for each file, the
loaders it goes through, how it failed then (``was``), the outcome now and a phrase its message
holds (``says``). ``python tests/fuzz_regressions.py`` writes the crafted ones again from the
seeds (module-dict-int-key.pt differs in torch.save's random serialization id); inputs the
fuzzer finds are added to the folder and the index as they are.
"""
from __future__ import annotations

import io
import json
import struct
import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fuzz_cases import _edit_safetensors, _set_size  # noqa: E402
from fuzz_seeds import SEEDS  # noqa: E402

REGRESSIONS = Path(__file__).resolve().parent / "fixtures" / "fuzz" / "regressions"


def _safetensors(tensors: dict[str, tuple[str, list[int], bytes]], metadata: dict[str, str] | None = None) -> bytes:
    header: dict = {"__metadata__": metadata} if metadata else {}
    body, at = b"", 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + len(data)]}
        body += data
        at += len(data)
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + body


def _module_with_int_key() -> bytes:
    import torch

    seq = torch.nn.Sequential(torch.nn.Linear(1, 1))
    seq._parameters[5] = torch.nn.Parameter(torch.zeros(1))  # a module dict key that is no string
    out = io.BytesIO()
    torch.save(seq, out)
    return out.getvalue()


def _tiff_strip_offsets_as_text(data: bytes) -> bytes:
    """StripOffsets (273) retyped as ASCII: Pillow's TIFF reader then fails on a string."""
    (ifd,) = struct.unpack("<I", data[4:8])
    (count,) = struct.unpack("<H", data[ifd:ifd + 2])
    out = bytearray(data)
    for i in range(count):
        at = ifd + 2 + 12 * i
        if struct.unpack("<H", data[at:at + 2])[0] == 273:
            out[at + 2:at + 4] = struct.pack("<H", 2)
    return bytes(out)


def _png_idat_claims(data: bytes, length: int) -> bytes:
    """The first IDAT chunk's length field says ``length`` (its data and CRC as they were)."""
    at = data.find(b"IDAT") - 4
    return data[:at] + struct.pack(">I", length) + data[at + 4:]


def _gif_screen(data: bytes, width: int, height: int) -> bytes:
    """The logical screen says ``width`` x ``height``; the one small frame stays as it is."""
    return data[:6] + struct.pack("<HH", width, height) + data[10:]


def _zip_deflated_pkl_claims(data: bytes, size: int) -> bytes:
    """data.pkl deflated, its headers declaring ``size`` bytes (it inflates to far fewer)."""
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        members = [(i.filename, zf.read(i)) for i in zf.infolist()]
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zw:
        for name, body in members:
            method = zipfile.ZIP_DEFLATED if name.endswith("data.pkl") else zipfile.ZIP_STORED
            zw.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), body, compress_type=method)
    raw = bytearray(out.getvalue())
    name = next(n for n, _ in members if n.endswith("data.pkl")).encode()
    local = raw.find(b"PK\x03\x04" + b"\x14\x00")
    while local >= 0:  # the local header and the central directory entry both say the size
        if raw[local + 30:local + 30 + len(name)] == name:
            raw[local + 22:local + 26] = struct.pack("<I", size)
        local = raw.find(b"PK\x03\x04", local + 4)
    central = raw.find(b"PK\x01\x02")
    while central >= 0:
        if raw[central + 46:central + 46 + len(name)] == name:
            raw[central + 24:central + 28] = struct.pack("<I", size)
        central = raw.find(b"PK\x01\x02", central + 4)
    return bytes(raw)


def crafted() -> dict[str, tuple[bytes, dict]]:
    """name -> (bytes, index entry) for each failure class of issue 44."""
    seed = {p.name: p.read_bytes() for p in SEEDS.iterdir()}
    converted = seed["tinynet_converted.safetensors"]
    f32 = lambda n: b"\0" * 4 * n  # noqa: E731
    many = {f"foreign.{i}.weight": ("F32", [1], f32(1)) for i in range(40)}
    return {
        "config-is-a-number.safetensors": (_edit_safetensors(converted, 0, "meta", "5"), {
            "loaders": ["load_model:tinynet"], "was": "TypeError in describe_from_metadata",
            "says": "metadata 'config' is a JSON int, expected an object"}),
        "config-is-a-list.safetensors": (_edit_safetensors(converted, 0, "meta", "[1e400]"), {
            "loaders": ["load_model:tinynet"], "was": "TypeError in describe_from_metadata",
            "says": "metadata 'config' is a JSON list"}),
        "module-dict-int-key.pt": (_module_with_int_key(), {
            "loaders": ["open_checkpoint"], "was": "TypeError in _flatten_module, outside the reader's boundary",
            "says": "corrupt or unexpected checkpoint content (TypeError"}),
        "tiff-strip-offsets-as-text.tif": (_tiff_strip_offsets_as_text(seed["rgb.tif"]), {
            "loaders": ["load_image", "load_mask"], "was": "TypeError from Pillow out of image._decode",
            "says": "not a readable image"}),
        "png-idat-claims-4gb.png": (_png_idat_claims(seed["rgb.png"], 0xFFFFFFF0), {
            "loaders": ["load_image", "load_mask"], "was": "MemoryError: Pillow reserved the IDAT's length",
            "outcome": "loaded", "max_growth_mb": 8}),
        "jpeg-claims-9500x9000.jpg": (_set_size("rgb.jpg", seed["rgb.jpg"], 9500, 9000), {
            "loaders": ["load_image"], "was": "MemoryError: a 1.2 GB decode of a tiny JPEG",
            "says": "-byte JPEG file cannot hold 9500x9000 pixels", "max_growth_mb": 8}),
        "jpeg-claims-3000x9500.jpg": (_set_size("rgb.jpg", seed["rgb.jpg"], 3000, 9500), {
            "loaders": ["load_image", "load_mask"], "was": "found by this fuzzer under the default budget: "
            "271 MB decoded from 919 bytes", "says": "-byte JPEG file cannot hold 3000x9500 pixels", "max_growth_mb": 8}),
        "gif-screen-9500x4096.gif": (_gif_screen(seed["palette.gif"], 9500, 4096), {
            "loaders": ["load_image", "load_mask"], "was": "363 MB decoded from 3.9 KB",
            "says": "-byte GIF file cannot hold 9500x4096 pixels", "max_growth_mb": 8}),
        "png-claims-65535x65535.png": (_set_size("rgb.png", seed["rgb.png"], 65535, 65535), {
            "loaders": ["load_image"], "was": "(a control: refused by Pillow's own limit before too)",
            "says": "decompression bombs"}),
        "zip-deflated-pkl-claims-16mb.pt": (_zip_deflated_pkl_claims(seed["tinynet_zip.pt"], 16 << 20), {
            "loaders": ["open_checkpoint"], "was": "a zero-filled buffer of the declared size before inflating",
            "says": "ends after", "max_growth_mb": 8}),
        "zero-elements-dim-3e9.safetensors": (_safetensors({"w": ("F32", [0, 3_000_000_000], b"")}), {
            "loaders": ["open_checkpoint"], "was": "shape (0, -1294967296) from MLX",
            "says": "dimension 3000000000 of shape (0, 3000000000) is over MLX's limit"}),
        "forty-unmapped-keys.safetensors": (_safetensors(many), {
            "loaders": ["load_model:tinynet"], "was": "a message of 41 lines, not naming the file (map_keys)",
            "says": "cannot map 40 checkpoint key(s) of"}),
        "layout-of-3d-head.safetensors": (_safetensors({"fc.weight": ("F32", [5, 4, 1], f32(20))}), {
            "loaders": ["load_model:tinynet"], "was": "layout_of's error did not name the file",
            "says": "no layout rule for head.weight with shape (5, 4, 1)"}),
        "misfit-shapes.safetensors": (_safetensors({"fc.weight": ("F32", [3, 4], f32(12)),
                                                    "fc.bias": ("F32", [3], f32(3))}), {
            "loaders": ["load_model:tinynet"], "was": "a problem list on many lines (convert_state_dict)",
            "says": "problem(s): "}),
    }


def write_crafted(out: Path = REGRESSIONS) -> None:
    out.mkdir(parents=True, exist_ok=True)
    index_path = out / "index.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {}
    for name, (data, entry) in crafted().items():
        (out / name).write_bytes(data)
        index[name] = entry
    index_path.write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    write_crafted()
    print("\n".join(f"{p.stat().st_size:8d} {p.name}" for p in sorted(REGRESSIONS.iterdir())))
