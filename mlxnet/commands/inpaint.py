"""`mlxnet inpaint`: fill the masked region of an image with LaMa (big-lama)."""
from __future__ import annotations

import json
import time
from typing import Optional

import typer

from mlxnet.errors import MlxnetError


def inpaint(
    image: str = typer.Argument(..., help="Image file (any format Pillow reads)."),
    mask: str = typer.Argument(..., help="Mask image of the same size: non-black (white) pixels are filled."),
    output: str = typer.Option(..., "--output", "-o", help="Where to write the result (.png, .jpg)."),
    weights: str = typer.Option("lama", "--weights", "-w",
                                help="Weights id (lama, lama-fourier) or file (.ckpt, .safetensors)."),
    model: Optional[str] = typer.Option(None, "--model", "-m",
                                        help="Variant of a weights file: lama or lama-fourier "
                                             "(default: from a converted file, else lama)."),
    dtype: str = typer.Option("float32", "--dtype", help="float32, float16 or bfloat16."),
    resize_mask: bool = typer.Option(False, "--resize-mask",
                                     help="Resize a mask of another size to the image (nearest)."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary instead of a line."),
) -> None:
    """Inpaint IMAGE where MASK is set and write the result to OUTPUT."""
    import mlx.core as mx

    import mlxnet
    from mlxnet.image import check_output_path, load_image, resize_pil, save_image
    from mlxnet import families

    if dtype not in ("float32", "float16", "bfloat16"):
        raise MlxnetError(f"unknown dtype {dtype!r}: expected float32, float16 or bfloat16")
    out_path = check_output_path(output, [image, mask])
    img = load_image(image)
    msk = load_image(mask, mode="L")
    if msk.shape != img.shape[:2]:
        if not resize_mask:
            raise MlxnetError(f"mask {mask} is {msk.shape[1]}×{msk.shape[0]} but image {image} is "
                              f"{img.shape[1]}×{img.shape[0]}; pass --resize-mask to resize it")
        msk = resize_pil(msk, (img.shape[1], img.shape[0]), "nearest")
    family = families.for_task(model or (weights if weights in families.variants() else "lama"), "inpaint")
    net = family.predictor(weights, model, dtype)
    start = time.perf_counter()
    result = family.inpaint(net, img, msk)
    seconds = time.perf_counter() - start
    save_image(result.render(img), out_path)
    if as_json:
        print(json.dumps({
            "image": image, "mask": mask, "output": str(out_path), **result.to_dict(), "weights": weights,
            "dtype": dtype, "backend": mlxnet.backend(), "seconds": round(seconds, 4),
            "peak_memory_mb": round(mx.get_peak_memory() / 2**20, 1)}, indent=1))
    else:
        print(f"{out_path}: {result.summary()} in {seconds:.2f} s ({mlxnet.backend()}, {dtype})")
