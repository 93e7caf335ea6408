"""The fuzzer's seed inputs: small, real-format checkpoints and images, kept as files in
tests/fixtures/fuzz/seeds/ (so that a case means the same bytes on every machine and PyTorch
version) and made by this module: ``python tests/fuzz_seeds.py`` writes them again.

The committed files are the canonical seeds: torch.save writes a random serialization id into
its zip files, so seeds written again differ from them in those bytes (and so do the cases).

Each seed names the loaders it goes through (tests/fuzz_worker.py's table); the fuzzer mutates
its bytes and sends every mutant through each of them.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

SEEDS = Path(__file__).resolve().parent / "fixtures" / "fuzz" / "seeds"

# seed file -> the loaders (tests/fuzz_worker.py LOADERS) its mutants go through
CHECKPOINT_LOADERS = ("open_checkpoint", "load_model:tinynet")
SEED_LOADERS: dict[str, tuple[str, ...]] = {
    "tinynet_zip.pt": CHECKPOINT_LOADERS,
    "tinynet_legacy.pt": CHECKPOINT_LOADERS,
    "tinynet_torch_layout.safetensors": CHECKPOINT_LOADERS,
    "tinynet_converted.safetensors": CHECKPOINT_LOADERS,
    "ultralytics_tiny.pt": ("open_checkpoint", "load_model:yolov8n"),
    "rgb.png": ("load_image", "load_mask"),
    "grey16.png": ("load_image", "load_mask"),
    "rgb.jpg": ("load_image",),
    "palette.gif": ("load_image", "load_mask"),
    "rgb.tif": ("load_image", "load_mask"),
    "rgb.webp": ("load_image",),
    # mlxnet app's HTTP API: an image upload, a detection on random weights, a click on an
    # image the app does not hold (its prompts are parsed; SAM never runs)
    "image.http": ("app_request",),
    "detect.http": ("app_request",),
    "segment.http": ("app_request",),
    # videos as mlxnet detect and track read them (H.264 in MP4, MPEG-4 part 2 in AVI)
    "clip.mp4": ("load_video",),
    "clip.avi": ("load_video",),
}


def _pixels(h: int = 32, w: int = 48) -> np.ndarray:
    """A gradient with some noise: big enough (a few KB per format) that most mutations land in
    pixel data rather than in the header, small enough to decode in a millisecond."""
    y, x = np.mgrid[:h, :w]
    noise = np.random.default_rng(0).integers(0, 24, (h, w, 3))
    return (np.stack([x * 5, y * 7, (x + y) * 3], axis=-1) + noise).astype(np.uint8)


def _images(out: Path) -> None:
    from PIL import Image

    rgb = Image.fromarray(_pixels())
    rgb.save(out / "rgb.png", optimize=False)
    grey = (np.arange(32 * 48, dtype=np.uint16).reshape(32, 48) * 42).astype(np.uint16)
    Image.fromarray(grey).save(out / "grey16.png")  # uint16 -> mode I;16
    rgb.save(out / "rgb.jpg", quality=80)
    rgb.convert("P", palette=Image.Palette.ADAPTIVE, colors=8).save(out / "palette.gif")
    rgb.save(out / "rgb.tif")  # uncompressed strips: StripOffsets and StripByteCounts in the header
    rgb.save(out / "rgb.webp", lossless=True)


def _request(path: str, fields: dict[str, str], files: dict[str, bytes]) -> bytes:
    """A multipart/form-data POST as a browser sends it."""
    boundary = "----mlxnetfuzz0123456789"
    body = b""
    for name, value in fields.items():
        body += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n").encode()
    for name, data in files.items():
        body += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{name}.png\"\r\n"
                 "Content-Type: image/png\r\n\r\n").encode() + data + b"\r\n"
    body += f"--{boundary}--\r\n".encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: multipart/form-data; boundary={boundary}"
            f"\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    return head + body


def _requests(out: Path) -> None:
    png = (out / "rgb.png").read_bytes()
    (out / "image.http").write_bytes(_request("/api/image", {}, {"image": png}))
    (out / "detect.http").write_bytes(_request("/api/detect", {"conf": "0.5"}, {"image": png}))
    (out / "segment.http").write_bytes(_request("/api/segment", {"image_id": "0" * 32, "points": "[[10, 12, 1]]",
                                                                 "box": "[1, 2, 30, 20]"}, {}))


def _checkpoints(out: Path) -> None:
    import torch
    from safetensors.numpy import save_file

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from fixtures.weights_torch_models import trained_tiny_net
    from testutil import save_ultralytics_pt

    net = trained_tiny_net(0)
    torch.save(net.state_dict(), out / "tinynet_zip.pt")
    torch.save(net.state_dict(), out / "tinynet_legacy.pt", _use_new_zipfile_serialization=False)
    state = {k: v.numpy() for k, v in net.state_dict().items()}
    save_file(state, str(out / "tinynet_torch_layout.safetensors"))

    import mlx.core as mx
    from fixtures.weights_models import SPEC  # noqa: F401  (registers "tinynet")
    from mlxnet.weights import convert_state_dict, save_converted

    converted = convert_state_dict({k: mx.array(v) for k, v in state.items()}, "tinynet", dtype="float32")
    save_converted(out / "tinynet_converted.safetensors", converted, "tinynet", {}, ["a", "b", "c", "d", "e"],
                   source="tinynet_zip.pt")
    # An ultralytics training checkpoint's layout (a pickled DetectionModel under "model", its
    # yaml and names) holding only the two tensors YOLOv8's describe reads: a 16-wide stem (n)
    # and a 2-class head.
    rng = np.random.default_rng(0)
    tiny = {"model.0.conv.weight": rng.standard_normal((16, 3, 3, 3)).astype(np.float32),
            "model.22.cv3.0.2.weight": rng.standard_normal((2, 16, 1, 1)).astype(np.float32)}
    save_ultralytics_pt(out / "ultralytics_tiny.pt", tiny, yaml={"nc": 2, "scale": "n"}, names={0: "cat", 1: "dog"})


def _videos(out: Path) -> None:
    """Eight frames of the seed gradient drifting, in the two containers and codecs mlxnet
    writes (a few KB each)."""
    import av

    frames = [np.roll(_pixels(), 3 * i, axis=1) for i in range(8)]
    for name, codec in (("clip.mp4", "libx264"), ("clip.avi", "mpeg4")):
        with av.open(str(out / name), "w") as container:
            stream = container.add_stream(codec, rate=8)
            stream.width, stream.height, stream.pix_fmt = 48, 32, "yuv420p"
            for rgb in frames:
                container.mux(stream.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")))
            container.mux(stream.encode())


def write_seeds(out: Path = SEEDS) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    _images(out)
    _videos(out)
    _requests(out)
    _checkpoints(out)
    (out / "README.json").write_text(json.dumps({"made_by": "tests/fuzz_seeds.py", "loaders": SEED_LOADERS},
                                                indent=1) + "\n")
    return sorted(out.iterdir())


if __name__ == "__main__":
    for path in write_seeds():
        print(f"{path.stat().st_size:8d} {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")
