"""Measuring models on labelled data: detection mAP (:mod:`.metrics`) on YOLO-format datasets
(:mod:`.dataset`). Host NumPy only; `mlxnet val` (mlxnet/commands/val.py) runs the model."""
