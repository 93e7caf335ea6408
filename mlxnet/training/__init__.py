"""Fine-tuning (``mlxnet train``): an ImageFolder dataset, the training loop and its
checkpoints; data-parallel under ``mlx.launch`` through :mod:`mlxnet.distributed`."""
