"""`mlxnet models`: every model id, its task, size and where its weights come from."""
from __future__ import annotations

import json
from typing import Optional

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from mlxnet.commands import grammar


def _parameters(variant: str) -> int:
    """Parameter count of the variant, from the shapes of a freshly built one (nothing is
    downloaded). The families' random initialisation evaluates its arrays, 13 s for all of
    them; only shapes are needed, so evaluation is skipped while building and the unevaluated
    model is dropped."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from mlxnet import families

    evaluate = mx.eval
    mx.eval = lambda *arrays, **kwargs: None
    try:
        model = families.family_of(variant).build(variant)
    finally:
        mx.eval = evaluate
    return sum(v.size for _, v in tree_flatten(model.parameters()))


def models(
    as_json: bool = grammar.json_lines("Print JSON Lines (one object per model) instead of a table."),
    device: Optional[str] = grammar.device(),
) -> None:
    """List every model id: its task, parameters, input size and the hub file its weights come from."""
    from mlxnet import families
    from mlxnet.weights import get_spec

    grammar.apply_device(device)
    rows = []
    for variant, family in families.variants().items():
        try:
            spec = get_spec(variant)
            source = f"hf://{spec.repo}/{spec.filename}" if spec.repo else "local files only"
        except Exception:  # noqa: BLE001 - a family registered without a weight spec
            source = "local files only"
        rows.append({"model": variant, "task": getattr(family, "task", "?"), "parameters": _parameters(variant),
                     "input": f"{family.default_size}²", "weights": source})
    if as_json:
        for row in rows:
            print(json.dumps(row))
        return
    console = Console()
    caption = "-w takes the model id (its hub file), a local file or 'random'"
    cells = [(r["model"], r["task"], f"{r['parameters'] / 1e6:.1f}M", r["input"], r["weights"]) for r in rows]
    if max(len(r["weights"]) for r in rows) + 50 > console.width:
        # Narrow terminal: each model's weights on a line of their own below it, so that no hub
        # file name is split mid-word.
        width = max(len(c[0]) for c in cells) + 2
        print(f"{'model':<{width}}{'task':<10}{'params':<8}{'input':<7}weights (below)")
        for model, task, params, size, weights in cells:
            print(f"{model:<{width}}{task:<10}{params:<8}{size}\n    {weights}")
        print(caption)
        return
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, caption=caption)
    for heading in ("model", "task", "params", "input", "weights"):
        table.add_column(heading, no_wrap=True)
    for row in cells:
        table.add_row(*row)
    console.print(table)
