"""Model ports, one module per family (installed as ``mlxnet.models``)."""
