"""The machinery every op family shares; no op lives here.

- :mod:`.registry`: the one registry of ops (``register``, ``get``, ``REGISTRY``) and the
  dispatcher that picks one of an op's faces (definition, CPU fast path, GPU kernel) per call;
- :mod:`.args`: PyTorch's spellings of integer arguments, for the ops' argument checks;
- :mod:`.kernel_source`: portable GPU kernels: the loader of ``custom_kernels/*.kern``, the
  Metal and CUDA preludes, ``PortableKernel`` and its launch helpers;
- :mod:`.kernel_launches`: every kernel launch the ops ask for, recorded without running (the
  compile checks).
"""
