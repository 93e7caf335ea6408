"""Kernel sources (``*.kern``), shipped as package data of ``mlxnet.custom_kernels``."""
