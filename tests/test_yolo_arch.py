"""The YOLO architecture builder against ultralytics 8.4 itself: YOLOv8, YOLO11 and YOLO26
detect, segment and pose networks built from the yaml ultralytics built them from, with the same
seeded weights (tests/fixtures/yolo_arch, scripts/goldens/golden_yolo_arch.py): parameter counts,
both heads' raw outputs (boxes, classes, mask coefficients, keypoints), the prototypes, the
decoded output, and YOLO26's NMS-free detections."""
from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_unflatten

from mlxnet.errors import MlxnetError
from mlxnet.models.yolo_arch import ARCHITECTURES, build, torch_state_to_mlx
from mlxnet.weights.seeded import seeded_yolo_state

FIXTURES = Path(__file__).parent / "fixtures" / "yolo_arch"
GOLD = mx.load(str(FIXTURES / "golden.safetensors"))
META = json.loads((FIXTURES / "golden.json").read_text())
MODELS = sorted(META)
X = GOLD["input"].transpose(0, 2, 3, 1)


def seeded_net(name: str, arch: dict | None = None, scale: str | None = None):
    net = build(arch or META[name]["yaml"], scale)
    shapes = [(k, (v.shape[0], v.shape[3], v.shape[1], v.shape[2]) if v.ndim == 4 else v.shape)
              for k, v in tree_flatten(net.parameters())]
    weights = torch_state_to_mlx(seeded_yolo_state(shapes, 1234, *META[name]["gains"]))
    net.update(tree_unflatten(list(weights.items())))
    return net


def flat_head(maps):
    """Per-level NHWC head maps as ultralytics' (N, C, A)."""
    boxes = mx.concatenate([b.reshape(b.shape[0], -1, b.shape[-1]) for b, _ in maps], axis=1)
    scores = mx.concatenate([s.reshape(s.shape[0], -1, s.shape[-1]) for _, s in maps], axis=1)
    return np.array(boxes.transpose(0, 2, 1)), np.array(scores.transpose(0, 2, 1))


def check_end2end(ours: np.ndarray, gold: np.ndarray, tol: float) -> None:
    """Best first, the same scores; every row of ours is a row of the golden (ties may swap)."""
    np.testing.assert_allclose(ours[..., 4], gold[..., 4], atol=tol)
    for row in ours[0, :50]:
        near = np.abs(gold[0, :, 4] - row[4]) <= tol
        candidates = gold[0, near]
        assert any(c[5] == row[5] and np.abs(c[:4] - row[:4]).max() <= 1e3 * tol for c in candidates), row


@pytest.fixture(scope="module", params=MODELS)
def model(request):
    return request.param, seeded_net(request.param)


def test_the_builder_reproduces_ultralytics_network(model):
    name, net = model
    counted = sum(v.size for k, v in tree_flatten(net.parameters()) if "running" not in k)
    assert counted == META[name]["parameters"]
    heads = {"": False, "o2o.": True} if f"{name}.o2o.boxes" in GOLD else {"": False}
    for prefix, one2one in heads.items():
        boxes, scores = flat_head(net.head_outputs(X, one2one=one2one))
        np.testing.assert_allclose(boxes, np.array(GOLD[f"{name}.{prefix}boxes"]), atol=2e-5, rtol=1e-5)
        np.testing.assert_allclose(scores, np.array(GOLD[f"{name}.{prefix}scores"]), atol=2e-5, rtol=1e-5)
        feats = net.features(X)
        extras = net.head.extras(feats, one2one=one2one) if net.task != "detect" else {}
        raw = extras.get("mask_coefficients", extras.get("keypoints"))
        if raw is not None:
            key = f"{name}.{prefix}{'mask' if net.task == 'segment' else 'kpts'}"
            np.testing.assert_allclose(np.array(raw).transpose(0, 2, 1), np.array(GOLD[key]), atol=2e-5, rtol=1e-5)
    outputs = net.task_outputs(X)
    np.testing.assert_allclose(np.array(net(X)), np.array(outputs["detections"]), atol=1e-6)
    parts = [outputs["detections"]] + [outputs[k] for k in ("mask_coefficients", "keypoints") if k in outputs]
    out = np.array(mx.concatenate(parts, axis=-1))
    np.testing.assert_allclose(out, np.array(GOLD[f"{name}.out"]).transpose(0, 2, 1), atol=1e-3, rtol=1e-5)
    if "protos" in outputs:
        np.testing.assert_allclose(np.array(outputs["protos"]).transpose(0, 3, 1, 2), np.array(GOLD[f"{name}.proto"]),
                                   atol=2e-5, rtol=1e-5)
    if f"{name}.e2e" in GOLD:
        check_end2end(np.array(net.end2end(X)), np.array(GOLD[f"{name}.e2e"]), 1e-5)


def test_the_families_own_architectures_are_ultralytics():
    for name in [m for m in MODELS if "-" not in m]:
        family, scale = name[:-1], name[-1]
        ours = {k: v.shape for k, v in tree_flatten(build(ARCHITECTURES[family], scale).parameters())}
        theirs = {k: v.shape for k, v in tree_flatten(build(META[name]["yaml"]).parameters())}
        assert ours == theirs, name


def test_folded_batchnorm_gives_the_same_detections():
    net = seeded_net("yolo26n")
    before, e2e = np.array(net(X)), np.array(net.end2end(X))
    net.fuse()
    assert not any(".bn." in k for k, _ in tree_flatten(net.parameters()))
    np.testing.assert_allclose(np.array(net(X)), before, atol=1e-3, rtol=1e-4)
    np.testing.assert_allclose(np.array(net.end2end(X))[..., 4], e2e[..., 4], atol=1e-5)


@pytest.mark.parametrize("rows, message", [
    ([[-1, 1, "Conv", [16, 3, 2]], [-1, 1, "GhostConv", [32]]], "module 'GhostConv' is not one mlxnet builds"),
    ([[-1, 1, "Conv", [16, 3, 2]], [-1, 1, "Conv"]], "expected [from, repeats, module, args]"),
    ([[-1, 1, "Conv", [16, 3, 2]]], "no head (Detect, Segment"),
    ([[-1, 1, "Conv", [16, 3, 2]], [-1, 1, "nn.Upsample", [None, 3, "bilinear"]]], "nearest x2"),
])
def test_an_architecture_mlxnet_cannot_build_is_named_in_one_line(rows, message):
    with pytest.raises(MlxnetError) as err:
        build({"backbone": rows, "head": []})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_an_unknown_scale_is_named():
    with pytest.raises(MlxnetError, match="unknown scale 'q'.*n, s, m, l, x"):
        build(ARCHITECTURES["yolo11"], "q")


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["yolo11n", "yolo26n"])
def test_the_builder_on_the_gpu(name):
    """The same networks on the GPU (float32; TF32 convolutions on NVIDIA, hence the looser bound)."""
    net = seeded_net(name)
    boxes, scores = flat_head(net.head_outputs(X))
    for ours, key in ((boxes, "boxes"), (scores, "scores")):
        gold = np.array(GOLD[f"{name}.{key}"])
        assert np.abs(ours - gold).max() <= 3e-3 * np.abs(gold).max(), key
    if f"{name}.e2e" in GOLD:
        e2e = np.array(net.end2end(X))
        np.testing.assert_allclose(e2e[..., 4], np.array(GOLD[f"{name}.e2e"])[..., 4], atol=2e-3)


@pytest.mark.parametrize("name", ["yolo11n-seg", "yolo26n-pose"])
def test_segment_and_pose_checkpoints_load_as_their_task(name, tmp_path):
    """A converted file of a segment or pose network loads as that model, and its predictions
    carry masks or keypoints; a file whose metadata names another task is refused in one line."""
    from mlxnet.models.yolo import YOLO
    from mlxnet.weights import save_converted

    net = seeded_net(name)
    params = dict(tree_flatten(net.parameters()))
    path = save_converted(tmp_path / "task.safetensors", params, name, {"nc": net.nc}, None, source="test")
    yolo = YOLO.from_pretrained(str(path))
    assert yolo.net.task == ("segment" if name.endswith("-seg") else "pose")
    found = yolo.predict(np.full((96, 128, 3), 90, np.uint8), conf=0.0, imgsz=64, max_det=5)
    assert len(found) > 0
    if name.endswith("-seg"):
        assert found.masks.shape == (len(found), 96, 128) and found.keypoints is None
    else:
        assert found.keypoints.shape == (len(found), 17, 3) and found.masks is None
        assert (found.keypoints[..., 0] <= 128).all() and (found.keypoints[..., 2] <= 1).all()
    wrong = save_converted(tmp_path / "wrong.safetensors", params, name.split("-")[0], {"nc": net.nc}, None,
                           source="test")
    with pytest.raises(MlxnetError) as err:
        YOLO.from_pretrained(str(wrong))
    assert f"holds a {name.split('-')[0]}" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("name, with_yaml", [("yolo11n", True), ("yolo26n", True), ("yolo26n", False)])
def test_an_ultralytics_checkpoint_loads_as_its_family(name, with_yaml, tmp_path):
    """A .pt laid out as ultralytics saves one: the family and scale from its yaml (or, without
    one, from its tensors), its class names, and the network's outputs."""
    from testutil import save_ultralytics_pt

    from mlxnet.models.yolo import YOLO
    from mlxnet.models.yolo_arch import layout_of
    from mlxnet.weights.layout import to_torch_layout

    net = seeded_net(name)
    state = {k: np.array(to_torch_layout(v, layout_of(k, (0,) * v.ndim))) for k, v in tree_flatten(net.parameters())}
    names = {i: f"thing{i}" for i in range(80)}
    path = save_ultralytics_pt(tmp_path / f"{name}.pt", state, yaml=META[name]["yaml"] if with_yaml else None,
                               names=names)
    loaded = YOLO.from_pretrained(str(path), fuse=False)
    assert (loaded.net.family, loaded.net.scale) == (name[:-1], name[-1])
    assert list(loaded.names) == list(names.values())
    # the file holds float16 weights, as ultralytics' do
    net.update(tree_unflatten([(k, v.astype(mx.float16).astype(mx.float32)) for k, v in tree_flatten(net.parameters())]))
    np.testing.assert_allclose(np.array(loaded.net(X)), np.array(net(X)), atol=1e-3, rtol=1e-5)


def test_yolo11_m_and_l_share_a_width_and_are_told_apart_by_depth(tmp_path):
    from testutil import save_ultralytics_pt

    from mlxnet.models.yolo import YOLO
    from mlxnet.models.yolo_arch import layout_of
    from mlxnet.weights.layout import to_torch_layout

    for scale in "ml":
        net = build(ARCHITECTURES["yolo11"], scale)
        state = {k: np.array(to_torch_layout(v, layout_of(k, (0,) * v.ndim)))
                 for k, v in tree_flatten(net.parameters())}
        path = save_ultralytics_pt(tmp_path / f"{scale}.pt", state)
        assert YOLO.from_pretrained(str(path), fuse=False).net.scale == scale


def test_predict_without_nms_reads_the_one_to_one_head(tmp_path):
    """YOLO.predict(nms=False): YOLO26's NMS-free rows above conf, mapped to the image; a model
    without a one-to-one head says so in one line."""
    from mlxnet.models.yolo import YOLO

    image = (np.array(GOLD["input"])[0].transpose(1, 2, 0) * 255).astype(np.uint8)  # 64 x 96: no letterbox padding
    det = YOLO(seeded_net("yolo26n"), [f"c{i}" for i in range(80)])
    found = det.predict(image, imgsz=96, conf=0.5, nms=False, max_det=300)
    rows = np.array(det.net.end2end(mx.array(image[None]).astype(mx.float32) / 255))[0]
    kept = rows[rows[:, 4] > 0.5]
    assert 0 < len(found.boxes) == len(kept)
    np.testing.assert_allclose(np.array(found.scores), kept[:, 4], atol=1e-6)
    np.testing.assert_array_equal(np.array(found.classes), kept[:, 5].astype(np.int32))
    only = det.predict(image, imgsz=96, conf=0.5, nms=False, classes=[int(kept[0, 5])])
    assert len(only.boxes) == int((kept[:, 5] == kept[0, 5]).sum())
    with pytest.raises(MlxnetError, match="nms=False needs an end-to-end model's one-to-one head"):
        YOLO(seeded_net("yolo11n"), [f"c{i}" for i in range(80)]).predict(image, imgsz=96, nms=False)


TASK_MODELS = [m for m in MODELS if m.endswith(("-seg", "-pose"))]


def _task_outputs_near_golden(net, name: str, tol: float, x: mx.array = X) -> None:
    """A segment or pose network's extra outputs against the golden, within ``tol`` of each
    tensor's largest magnitude."""
    feats = net.features(x)
    raw = net.head.extras(feats)
    key = "mask_coefficients" if net.task == "segment" else "keypoints"
    gold = np.array(GOLD[f"{name}.{'mask' if net.task == 'segment' else 'kpts'}"])
    ours = np.array(raw[key].astype(mx.float32)).transpose(0, 2, 1)
    assert np.abs(ours - gold).max() <= tol * np.abs(gold).max(), key
    if "protos" in raw:
        gold = np.array(GOLD[f"{name}.proto"])
        ours = np.array(raw["protos"].astype(mx.float32)).transpose(0, 3, 1, 2)
        assert np.abs(ours - gold).max() <= tol * np.abs(gold).max(), "protos"


@pytest.mark.parametrize("name", TASK_MODELS)
def test_segment_and_pose_heads_in_float16(name):
    """float16 weights and activations: the mask coefficients, prototypes and raw keypoints within
    3% of each tensor's range of ultralytics' float32 outputs (float32: 2e-5, above)."""
    net = seeded_net(name)
    net.set_dtype(mx.float16)
    _task_outputs_near_golden(net, name, 3e-2, X.astype(mx.float16))


@pytest.mark.gpu
@pytest.mark.parametrize("name", TASK_MODELS)
def test_segment_and_pose_on_the_gpu(name, tmp_path):
    """On the GPU: the extra outputs against the golden (TF32 convolutions: 3e-3 of the range);
    and on bus.jpg's letterboxed pixels, the 20 best anchors' keypoints within 0.5 px of the CPU's,
    or their whole masks as the GPU makes them (at the image's size) between the host's in-box
    masks with every logit lowered and raised by 1% of their range (pixels nearer the threshold
    may go either way under TF32). Anchor by anchor: these seeded weights score hundreds of boxes
    1.0, whose order after NMS ties may differ between the two devices."""
    from test_detect_tasks import BUS, saved_checkpoint

    import mlxnet
    from mlxnet.image import load_image
    from mlxnet.models.yolo import YOLO
    from mlxnet.models.yolo_instances import instance_masks
    from mlxnet.models.yolo_process import letterbox

    _task_outputs_near_golden(seeded_net(name), name, 3e-3)
    weights = saved_checkpoint(name, tmp_path)
    photo = load_image(BUS)
    x = mx.array(letterbox(photo, 320)[None]).astype(mx.float32) / 255

    def outputs():
        out = YOLO.from_pretrained(str(weights)).net.task_outputs(x)
        return {k: np.array(v.astype(mx.float32)) for k, v in out.items()}
    on_gpu = outputs()
    with mlxnet.use_device("cpu"):
        on_cpu = outputs()
    best = np.argsort(-on_cpu["detections"][0, :, 4:].max(axis=1))[:20]
    if "protos" in on_cpu:
        boxes = np.tile([0.0, 0.0, x.shape[2], x.shape[1]], (20, 1))  # whole masks (seeded boxes may be inverted)

        def masks(o, sign, shift=0.0):
            """The 20 masks, every logit raised by ``shift`` (a prototype of ones: the bilinear
            maps' weights sum to 1); seeded prototypes may sum below 0 everywhere: ``sign``."""
            protos = o["protos"][0]
            protos = np.concatenate([protos, np.ones((*protos.shape[:2], 1), np.float32)], axis=-1)
            coefficients = np.concatenate([sign * o["mask_coefficients"][0, best], np.full((20, 1), shift)], axis=-1)
            return instance_masks(mx.array(protos), mx.array(coefficients.astype(np.float32)), boxes,
                                  x.shape[1:3]).dense()
        sign = 1.0
        with mlxnet.use_device("cpu"):  # the host's in-box masks
            if not masks(on_cpu, sign).any():
                sign = -1.0
            # TF32 on the GPU moves logits by a fraction of their range: pixels that near 0 may differ.
            margin = 0.01 * np.abs(on_cpu["mask_coefficients"][0, best] @ on_cpu["protos"][0].reshape(-1, on_cpu["protos"].shape[-1]).T).max()
            surely, maybe = masks(on_cpu, sign, -margin), masks(on_cpu, sign, margin)
        whole = masks(on_gpu, sign)  # made whole on the GPU, brought back as the boxes' pixels
        assert surely.any()  # masks with pixels: the comparison means something
        assert (maybe & ~surely).sum() <= 0.2 * maybe.sum()  # the margin leaves most pixels decided
        assert (surely <= whole).all() and (whole <= maybe).all()
    else:
        np.testing.assert_allclose(on_gpu["keypoints"][0, best], on_cpu["keypoints"][0, best], atol=0.5)
