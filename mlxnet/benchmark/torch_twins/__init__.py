"""Plain-PyTorch twins of mlxnet's models: the baselines of ``mlxnet bench --compare torch``
where the reference packages (torchvision, ultralytics, MobileSAM) cannot be imported. Each
needs torch alone and is imported only when a comparison asks for it."""
