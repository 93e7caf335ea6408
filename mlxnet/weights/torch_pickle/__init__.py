"""Read PyTorch checkpoints (.pt/.pth/.ckpt) without torch and without running pickled code.

``torch.save`` writes a pickle whose tensors point at raw storages kept beside it: in a zip
archive (``<name>/data.pkl`` + ``<name>/data/<key>``, torch >= 1.6) or, in the legacy format,
after it in the same file (magic number, protocol, sys_info, the pickle, the storage keys, then
each storage as an int64 element count and its bytes).

Unpickling normally imports and calls whatever the file names. Here ``find_class`` hands out
real objects only for an allow-list of data types and tensor-rebuild functions (reimplemented
on numpy); every other name becomes an inert :class:`Record` type. A record can be *created*
the way pickle creates class instances (``NEWOBJ`` + ``BUILD``: it keeps the args and state,
e.g. a whole ``nn.Module``'s ``__dict__``), but *calling* it (``REDUCE``: ``os.system``,
``builtins.eval``, ``functools.partial`` ...) is refused with an error naming the callable.

Hostile files are read with bounded memory: every size a file declares is checked against the
bytes actually in it before anything is allocated. The modules, from the bottom up, each say
which of these checks they make:

* :mod:`.errors`: how reading fails (refused call, corrupt file, truncated file);
* :mod:`.records`: the inert stand-ins for foreign classes, and the allow-list's entries;
* :mod:`.limits`: the bounds (view budget, inflation, dimensions, record types) and the checks
  of declared sizes, strides, offsets and counts;
* :mod:`.tensors`: storages and the tensor views rebuilt from them;
* :mod:`.allowlist`: every name a pickle may use, and the checking constructors behind them;
* :mod:`.unpickler`: the restricted pickle machine;
* :mod:`.zip_archive` and :mod:`.legacy`: the two containers;
* :mod:`.reader`: :func:`read_torch_checkpoint`, which tells them apart;
* :mod:`.state_dict`: :func:`find_state_dict`, the flat ``{name: tensor}`` in what was read.

What remains is the pickle's own objects: memory in proportion to the pickle's length.
"""
from .reader import read_torch_checkpoint
from .records import Record
from .state_dict import find_state_dict, is_tensor
from .tensors import Tensor

__all__ = ["Record", "Tensor", "find_state_dict", "is_tensor", "read_torch_checkpoint"]
