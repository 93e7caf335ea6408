"""Each model's latency on one device, mlxnet against PyTorch, in one run.

    python scripts/bench_models.py --device cpu [--only resnet50 ...] [--json out.json]
    python scripts/bench_models.py --device gpu [--batch 1 8] [--dtype float32 float16] [--torch-compile]

For every entry, batch size and dtype it times, alternating rep by rep (so a noisy machine
slows all alike): mlxnet eager (``MLXNET_COMPILE=0``), mlxnet as the ``mlxnet`` command runs it
(compiled on GPUs, see mlxnet.nn.compiled; MLX's CUDA kernels launched directly, see
mlxnet.tune_gpu, unless ``--cuda-graphs``), PyTorch eager and, with ``--torch-compile``,
``torch.compile(mode="reduce-overhead")`` (CUDA graphs). It also counts the primitives MLX runs
per forward, eager and compiled (views excluded: about one kernel launch each). Models have
random weights (speed does not depend on the values). Float32 runs as each library defaults
(MLX's CUDA GEMMs use TF32; PyTorch's convolutions do, its matmuls do not); the header says
which. Entries are plain functions in ENTRIES; a model family adds one.

The PyTorch references come with the script: ``scripts/yolo_torch.py`` and
``scripts/lama_torch.py`` are plain-torch twins; MobileSAM's modules are read from ``.ref-sam/``
(see scripts/sam_reference.py); ultralytics and torchvision are used where installed.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import mlxnet  # noqa: F401  (gives MLX OpenBLAS on Linux)
from mlxnet import families
from mlxnet.env import switch
import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

sys.path.insert(0, str(Path(__file__).parent))  # the plain-torch references beside this script


@dataclass
class Bench:
    """One entry at one batch size and dtype: ``mlx()`` builds the forward's outputs (not yet
    evaluated); the PyTorch module and its inputs, or None where there is no reference."""
    mlx: Callable[[], Any]
    torch_module: Any = None
    torch_inputs: tuple = ()
    note: str = ""
    torch_dtype: str = "float32"


Build = Callable[[str, int, str], Bench]  # (device, batch, dtype) -> Bench

VIEWS = {"Reshape", "Broadcast", "Slice", "Transpose", "AsStrided", "Squeeze", "ExpandDims",
         "Depends", "StopGradient", "Flatten", "Unflatten", "Split"}


def primitives(outputs: Any) -> int:
    """Primitives in the graph of ``outputs`` (unevaluated), views excluded: MLX launches about
    one kernel for each (a compiled, fused chain is one)."""
    leaves = [a for _, a in tree_flatten(outputs) if isinstance(a, mx.array)]
    with tempfile.NamedTemporaryFile("r", suffix=".dot") as f:
        mx.export_to_dot(f.name, *leaves)
        labels = re.findall(r'label ="([A-Za-z0-9_]+)"', f.read())
    return sum(label not in VIEWS for label in labels)


def time_alternating(runs: dict[str, Callable[[], None]], warmup: int, reps: int,
                     pause: float) -> dict[str, float]:
    """Median wall ms of each run (each call fully synchronised), alternating rep by rep. The
    pause (CPU only) lets the other library's worker threads stop spinning (OpenMP spins
    ~200 ms after a parallel region), which would otherwise steal the cores."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for rep in range(warmup + reps):
        for name, run in runs.items():
            time.sleep(pause)
            t = time.perf_counter()
            run()
            if rep >= warmup:
                times[name].append((time.perf_counter() - t) * 1e3)
    return {name: statistics.median(ts) for name, ts in times.items()}


def torch_device(device: str):
    import torch

    if device == "gpu":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
    return torch.device("cpu")


def torch_sync(dev) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize()
    elif dev.type == "mps":
        torch.mps.synchronize()


def _torch_ready(module, inputs: tuple, device: str, dtype: str) -> tuple[Any, tuple, str]:
    """Module and inputs on the device, in float16 where the device runs it (CUDA, MPS)."""
    dev = torch_device(device)
    half = dtype == "float16" and dev.type != "cpu"
    module = module.eval().to(dev)
    inputs = tuple(x.to(dev) for x in inputs)
    if half:
        module = module.half()
        inputs = tuple(x.half() if x.is_floating_point() else x for x in inputs)
    return module, inputs, "float16" if half else "float32"


def _mlx_ready(model, dtype: str):
    model.eval()
    if dtype != "float32":
        model.set_dtype(getattr(mx, dtype))
    mx.eval(model.parameters())
    return model


# --- entries --------------------------------------------------------------------------------------

def resnet_entry(name: str, size: int = 224) -> Build:
    def build(device: str, batch: int, dtype: str) -> Bench:
        import torch

        from mlxnet.models import resnet

        model = _mlx_ready(resnet.resnet(name), dtype)
        x = mx.random.normal((batch, size, size, 3)).astype(getattr(mx, dtype))
        try:
            import torchvision

            tmodel, note = getattr(torchvision.models, name)(), "torchvision"
        except Exception:  # torchvision missing or broken (PyPI's, against CPU torch here)
            tmodel, note = _torch_resnet(name), "same architecture in plain torch (torchvision unavailable)"
        tmodel, tx, tdtype = _torch_ready(tmodel, (torch.randn(batch, 3, size, size),), device, dtype)
        return Bench(lambda: model(x), tmodel, tx, note, tdtype)
    return build


def _torch_resnet(name: str):
    """Timing stand-in for torchvision's ResNet where torchvision cannot be imported."""
    import torch.nn as tnn

    from mlxnet.models.resnet import CONFIGS, Bottleneck

    cfg = CONFIGS[name]
    bottleneck = cfg.block is Bottleneck

    class Block(tnn.Module):
        def __init__(self, cin, planes, stride):
            super().__init__()
            exp = 4 if bottleneck else 1
            if bottleneck:
                self.body = tnn.Sequential(
                    tnn.Conv2d(cin, planes, 1, bias=False), tnn.BatchNorm2d(planes), tnn.ReLU(),
                    tnn.Conv2d(planes, planes, 3, stride, 1, bias=False), tnn.BatchNorm2d(planes), tnn.ReLU(),
                    tnn.Conv2d(planes, planes * exp, 1, bias=False), tnn.BatchNorm2d(planes * exp))
            else:
                self.body = tnn.Sequential(
                    tnn.Conv2d(cin, planes, 3, stride, 1, bias=False), tnn.BatchNorm2d(planes), tnn.ReLU(),
                    tnn.Conv2d(planes, planes, 3, 1, 1, bias=False), tnn.BatchNorm2d(planes))
            self.short = (tnn.Sequential(tnn.Conv2d(cin, planes * exp, 1, stride, bias=False),
                                         tnn.BatchNorm2d(planes * exp))
                          if stride != 1 or cin != planes * exp else tnn.Identity())
            self.out = planes * exp

        def forward(self, x):
            return (self.body(x) + self.short(x)).relu()

    layers, cin = [tnn.Conv2d(3, 64, 7, 2, 3, bias=False), tnn.BatchNorm2d(64), tnn.ReLU(),
                   tnn.MaxPool2d(3, 2, 1)], 64
    for i, (planes, n) in enumerate(zip((64, 128, 256, 512), cfg.layers)):
        for j in range(n):
            b = Block(cin, planes, 2 if i > 0 and j == 0 else 1)
            layers.append(b)
            cin = b.out
    layers += [tnn.AdaptiveAvgPool2d(1), tnn.Flatten(), tnn.Linear(cin, 1000)]
    return tnn.Sequential(*layers)


def yolo_entry(scale: str, size: int = 640) -> Build:
    """YOLOv8 network forward (BN folded, as both predictors run it) on size² images, vs
    ultralytics' DetectionModel where it imports, else the same network in plain torch."""
    def build(device: str, batch: int, dtype: str) -> Bench:
        import torch

        from mlxnet.models import yolo

        net = _mlx_ready(yolo.YOLOv8(scale).fuse(), dtype)
        x = mx.random.uniform(shape=(batch, size, size, 3)).astype(getattr(mx, dtype))
        try:
            from ultralytics.nn.tasks import DetectionModel

            tmodel = DetectionModel(f"yolov8{scale}.yaml", verbose=False).eval().fuse(verbose=False)
            note = "ultralytics DetectionModel (fused)"
        except ImportError:  # ultralytics needs torchvision
            import yolo_torch

            tmodel, note = yolo_torch.YOLOv8(scale), "same network in plain torch (scripts/yolo_torch.py)"
        tmodel, tx, tdtype = _torch_ready(tmodel, (torch.rand(batch, 3, size, size),), device, dtype)
        return Bench(lambda: net(x), tmodel, tx, note, tdtype)
    return build


def yolo_nms_entry(candidates: int) -> Callable[[str], Bench]:
    """Postprocess (threshold + class-aware NMS, max_det 300) of one 640x640 head output (8400
    anchors) with about ``candidates`` boxes over the threshold, vs ultralytics' NMS."""
    def build(device: str, batch: int, dtype: str) -> Bench:
        from mlxnet.models import yolo
        from mlxnet.models.yolo_process import postprocess

        pred = yolo.seeded("n")(mx.random.uniform(shape=(1, 640, 640, 3), key=mx.random.key(1)))[0]
        best = np.sort(np.array(pred[:, 4:].max(axis=-1)))[::-1]
        conf = float(best[min(candidates, len(best) - 1)])
        mx.eval(pred)
        run_mlx = lambda: postprocess(pred, conf=conf, iou=0.7)  # noqa: E731
        note = f"{len(postprocess(pred, conf=conf, iou=0.7))} kept of {candidates} candidates"
        try:
            import torch
            from ultralytics.utils.nms import non_max_suppression

            tpred = torch.from_numpy(np.array(pred).T[None].copy()).to(torch_device(device))
            return Bench(run_mlx, _Call(lambda p: non_max_suppression(p, conf, 0.7)), (tpred,),
                         note + "; vs ultralytics NMS")
        except ImportError:
            return Bench(run_mlx, note=note)
    return build


class _Call:
    """A function standing where a PyTorch module would (no .half(), never compiled)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)


def _mobile_sam():
    import sam_reference

    return sam_reference.modeling()


def sam_encoder_entry(size: int = 1024) -> Build:
    """SAM-tiny's TinyViT encoder on size² images, vs MobileSAM's (scripts/sam_reference.py)."""
    def build(device: str, batch: int, dtype: str) -> Bench:
        import torch

        from mlxnet.models import sam

        encoder = _mlx_ready(sam.sam_tiny().image_encoder, dtype)
        x = mx.random.normal((batch, size, size, 3)).astype(getattr(mx, dtype))
        try:
            m = _mobile_sam()
        except ImportError as e:
            return Bench(lambda: encoder(x), note=str(e))
        tmodel = m.TinyViT(img_size=size, embed_dims=[64, 128, 160, 320], depths=[2, 2, 6, 2],
                           num_heads=[2, 4, 5, 10], window_sizes=[7, 7, 14, 7], drop_path_rate=0.0,
                           layer_lr_decay=0.8)
        tmodel, tx, tdtype = _torch_ready(tmodel, (torch.randn(batch, 3, size, size),), device, dtype)
        return Bench(lambda: encoder(x), tmodel, tx, "MobileSAM TinyViT (github ChaoningZhang/MobileSAM)", tdtype)
    return build


def sam_decoder_entry() -> Build:
    """SAM-tiny's prompt encoder + mask decoder: ``batch`` one-point prompts on one image's
    embedding (3 masks each), vs MobileSAM's modules."""
    def build(device: str, batch: int, dtype: str) -> Bench:
        import torch

        from mlxnet.models import sam

        model = _mlx_ready(sam.sam_tiny(), dtype)
        emb = mx.random.normal((1, 64, 64, 256)).astype(getattr(mx, dtype))
        pts = mx.random.uniform(0, 1024, (batch, 1, 2))
        labels = mx.ones((batch, 1), mx.int32)
        pe = model.prompt_encoder.get_dense_pe()

        def run_mlx():
            sparse, dense = model.prompt_encoder((pts, labels), None, None)
            return model.mask_decoder(emb, pe, sparse, dense, True)
        try:
            m = _mobile_sam()
        except ImportError as e:
            return Bench(run_mlx, note=str(e))

        class Decoder(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.penc = m.PromptEncoder(embed_dim=256, image_embedding_size=(64, 64),
                                            input_image_size=(1024, 1024), mask_in_chans=16)
                self.dec = m.MaskDecoder(num_multimask_outputs=3, transformer=m.TwoWayTransformer(
                    depth=2, embedding_dim=256, mlp_dim=2048, num_heads=8), transformer_dim=256)

            def half(self):  # the prompt encoder's positional encoding stays float32, as in mlxnet
                self.dec.half()
                return self

            def forward(self, emb, pts, labels):
                sparse, dense = self.penc((pts, labels), None, None)
                return self.dec(emb, self.penc.get_dense_pe().to(emb.dtype), sparse.to(emb.dtype), dense.to(emb.dtype), True)
        tmodel, (temb, tpts, tlab), tdtype = _torch_ready(
            Decoder(), (torch.randn(1, 256, 64, 64), torch.rand(batch, 1, 2) * 1024,
                        torch.ones(batch, 1, dtype=torch.int64)), device, dtype)
        tpts = tpts.float()  # the prompt encoder's positional encoding runs in float32
        return Bench(run_mlx, tmodel, (temb, tpts, tlab), "MobileSAM prompt encoder + mask decoder", tdtype)
    return build


def lama_entry(size: int = 512) -> Build:
    """LaMa (big-lama) generator on size² masked images + masks, vs the same generator in plain
    PyTorch (scripts/lama_torch.py, checked against advimman/lama by scripts/golden_lama.py).
    float16: mlxnet's FourierUnits stay float32 (as LaMa.set_dtype does); torch all float16."""
    def build(device: str, batch: int, dtype: str) -> Bench:
        import torch

        import lama_torch
        from mlxnet.models.lama import LaMa

        model = _mlx_ready(LaMa(), dtype)
        x = mx.random.uniform(shape=(batch, size, size, 4))
        tmodel, tx, tdtype = _torch_ready(lama_torch.Generator(), (torch.rand(batch, 4, size, size),), device, dtype)
        return Bench(lambda: model(x), tmodel, tx, "plain-torch big-lama", tdtype)
    return build


ENTRIES: dict[str, Build] = {
    "resnet18": resnet_entry("resnet18"),
    "resnet50": resnet_entry("resnet50"),
    **{f"yolov8{s}": yolo_entry(s) for s in "nsmlx"},
    "yolov8-nms-300": yolo_nms_entry(300), "yolov8-nms-8400": yolo_nms_entry(8399),
    "sam-tiny-encoder": sam_encoder_entry(), "sam-tiny-decoder": sam_decoder_entry(),
    "lama-512": lama_entry(512),
}
SINGLE = {"yolov8-nms-300", "yolov8-nms-8400"}  # postprocessing: one batch size, float32


def family_entry(variant: str) -> Build:
    """Any registered model variant, through the model interface (no PyTorch baseline)."""
    def build(device: str, batch: int, dtype: str) -> Bench:
        family = families.family_of(variant)
        model = _mlx_ready(family.checked(family.build(variant)), dtype)
        inputs = family.example_inputs(variant, family.default_size)
        mx.eval(inputs)
        return Bench(lambda: model(*inputs), note="no PyTorch baseline in this script")
    return build


def entries() -> dict[str, Build]:
    """The hand-made entries (with PyTorch baselines), then every other registered variant."""
    covered = {name.split("-encoder")[0].split("-decoder")[0].split("-512")[0] for name in ENTRIES}
    extra = {v: family_entry(v) for v in families.variants() if v not in covered and v not in ENTRIES}
    return {**ENTRIES, **extra}


# --- running --------------------------------------------------------------------------------------

def mlx_runner(forward: Callable[[], Any], compiled: bool | None = None) -> Callable[[], None]:
    """One timed call: build ``forward()``'s outputs and evaluate them to the end, compiled or
    not (None: the library's default)."""
    def run() -> None:
        with contextlib.nullcontext() if compiled is None else mlxnet.use_compile(compiled):
            mx.eval(forward())
        mx.synchronize()
    return run


def torch_runner(module: Any, inputs: tuple, device: str) -> Callable[[], None]:
    """One timed PyTorch call, synchronised with the device."""
    import torch

    dev = torch_device(device)

    def run() -> None:
        with torch.no_grad():
            module(*inputs)
        torch_sync(dev)
    return run


def measure(bench: Bench, device: str, reps: int, torch_compile: bool) -> dict[str, Any]:
    """Times (ms) and primitive counts of one Bench."""
    import torch

    pause = 0.25 if device == "cpu" else 0.0
    runs: dict[str, Callable[[], None]] = {"mlxnet_eager": mlx_runner(bench.mlx, compiled=False)}
    default_compiled = mlxnet.compile_enabled()
    if default_compiled:
        runs["mlxnet"] = mlx_runner(bench.mlx, compiled=True)
    if bench.torch_module is not None:
        runs["torch"] = torch_runner(bench.torch_module, bench.torch_inputs, device)
        if torch_compile and not isinstance(bench.torch_module, _Call):
            runs["torch_compile"] = torch_runner(torch.compile(bench.torch_module, mode="reduce-overhead"),
                                                 bench.torch_inputs, device)
    # torch.compile compiles on its first calls: more warm-up where it runs.
    result: dict[str, Any] = time_alternating(runs, warmup=5 if torch_compile else 2, reps=reps, pause=pause)
    if not default_compiled:
        result["mlxnet"] = result["mlxnet_eager"]
    with mlxnet.use_compile(False), _whole_graph():
        result["launches_eager"] = primitives(bench.mlx())
    with mlxnet.use_compile(True), _whole_graph():
        result["launches_compiled"] = primitives(bench.mlx())
    return result


@contextlib.contextmanager
def _whole_graph():
    """Forwards built without evaluating anything: staged models hand their first stages to the
    device (mlxnet.nn.handoff, through mx.async_eval), which would leave only the last stage's
    graph to count."""
    real = mx.async_eval
    mx.async_eval = lambda *arrays: None
    try:
        yield
    finally:
        mx.async_eval = real


def _free() -> None:
    """Drop one entry's models before the next (MLX's and PyTorch's caches hold GPU memory)."""
    gc.collect()
    mx.clear_cache()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:
        pass


def _header(device: str) -> str:
    import torch

    dev = torch_device(device)
    text = (f"mlxnet backend {mlxnet.backend()} (compiled by default: {mlxnet.compile_enabled()}; "
            f"{mlxnet.blas_info()}; {mlxnet.cuda_graphs_info()}); torch {torch.__version__} on {dev}, {torch.get_num_threads()} threads")
    if dev.type == "cuda":
        text += (f"; {torch.cuda.get_device_name()}; torch float32 TF32: conv "
                 f"{torch.backends.cudnn.allow_tf32}, matmul {torch.backends.cuda.matmul.allow_tf32}")
    return text


def _ratio(a: float, b: float | None) -> str:
    return f"{b / a:5.2f}x" if b and a == a and b == b else "    -"


def markdown(rows: list[dict], graph_rows: list[dict] | None = None) -> str:
    """The README's table from a --json file: one line per model, batch and dtype; with the rows
    of a --cuda-graphs run, their mlxnet time as one more column."""
    graphs = {(r["model"], r["batch"], r["dtype"]): r["mlxnet"] for r in graph_rows or []}
    extra = " mlxnet, MLX's CUDA graphs |" if graph_rows else ""
    lines = ["| model | batch | dtype | mlxnet eager | mlxnet (default) |" + extra +
             " PyTorch eager | torch.compile | PyTorch / mlxnet | launches eager → compiled |",
             "|---|---|---|---|---|" + ("---|" if graph_rows else "") + "---|---|---|---|"]

    def ms(v: float | None) -> str:
        return f"{v:.2f}" if v else "—"
    for r in rows:
        t = r.get("torch")
        ratio = f"{t / r['mlxnet']:.2f}×" if t else "—"
        graph = f" {ms(graphs.get((r['model'], r['batch'], r['dtype'])))} |" if graph_rows else ""
        lines.append(f"| {r['model']} | {r['batch']} | {r['dtype']} | {ms(r['mlxnet_eager'])} | {ms(r['mlxnet'])} |"
                     f"{graph} {ms(t)} | {ms(r.get('torch_compile'))} | {ratio} | "
                     f"{r['launches_eager']} → {r['launches_compiled']} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--batch", type=int, nargs="+", default=[1])
    ap.add_argument("--dtype", nargs="+", default=["float32"], choices=["float32", "float16", "bfloat16"])
    ap.add_argument("--reps", type=int, default=None,
                    help="timed calls per run (default: 5 on the CPU, 20 on the GPU, where calls are short "
                         "and a loaded host moves single calls most)")
    ap.add_argument("--torch-compile", action="store_true",
                    help='also time torch.compile(mode="reduce-overhead") (compiles each model: slow)')
    ap.add_argument("--cuda-graphs", action="store_true",
                    help="keep MLX's CUDA graphs (what a library user gets without mlxnet.tune_gpu())")
    ap.add_argument("--json")
    ap.add_argument("--list", action="store_true", help="list the entries and exit")
    ap.add_argument("--markdown", metavar="JSON", nargs="+",
                    help="print the table of a --json file as markdown and exit; a second file, "
                         "from a --cuda-graphs run, adds its mlxnet column")
    a = ap.parse_args()
    if a.markdown:
        rows, *graphs = [json.load(open(path))["rows"] for path in a.markdown]
        print(markdown(rows, graphs[0] if graphs else None))
        return
    # As the mlxnet command does for its own process (before any GPU work).
    if switch("MLXNET_MALLOC") == "tuned":
        mlxnet.tune_cpu()
    if not a.cuda_graphs:
        mlxnet.tune_gpu()
    if a.list:
        print("\n".join(entries()))
        return
    mlxnet.use_device(a.device)
    mlxnet.native_info(build=a.device == "cpu")  # build or load the CPU primitives before timing
    header = _header(a.device)  # imports torch and asks the device: once
    print(header)
    print(f"{'model':18s} {'b':>2s} {'dtype':8s} {'eager':>8s} {'mlxnet':>8s} {'torch':>8s} "
          f"{'t.comp':>8s} {'vs torch':>8s} {'launches':>10s}  note   (ms; 'vs torch' = torch / mlxnet)")
    rows = []
    for name, build in entries().items():
        if a.only and name not in a.only:
            continue
        for batch in ([1] if name in SINGLE else a.batch):
            for dtype in (["float32"] if name in SINGLE else a.dtype):
                try:
                    bench = build(a.device, batch, dtype)
                    r = measure(bench, a.device, a.reps or (20 if a.device == "gpu" else 5), a.torch_compile)
                except Exception as e:  # noqa: BLE001 - one failing entry must not lose the others
                    print(f"{name:18s} {batch:2d} {dtype:8s} failed: {type(e).__name__}: {str(e).splitlines()[0]}",
                          flush=True)
                    _free()
                    continue
                row = {"model": name, "batch": batch, "dtype": dtype, "torch_dtype": bench.torch_dtype,
                       "note": bench.note, **r}
                rows.append(row)
                t, tc = r.get("torch"), r.get("torch_compile")
                print(f"{name:18s} {batch:2d} {dtype:8s} {r['mlxnet_eager']:8.2f} {r['mlxnet']:8.2f} "
                      f"{t if t else float('nan'):8.2f} {tc if tc else float('nan'):8.2f} "
                      f"{_ratio(r['mlxnet'], t):>8s} {r['launches_eager']:4d}/{r['launches_compiled']:<4d}  "
                      f"{bench.note}{'' if bench.torch_dtype == dtype or t is None else ' (torch ' + bench.torch_dtype + ')'}",
                      flush=True)
                del bench
                _free()
                if a.json:  # after every row: a run cut short keeps what it measured
                    with open(a.json, "w") as f:
                        json.dump({"device": a.device, "backend": mlxnet.backend(), "header": header,
                                   "rows": rows}, f, indent=1)


if __name__ == "__main__":
    np.random.seed(0)
    main()
