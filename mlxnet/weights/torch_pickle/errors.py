"""How reading fails inside the package; :func:`~.reader.read_torch_checkpoint` turns each into
one :class:`~mlxnet.errors.MlxnetError` line naming the file."""
from __future__ import annotations

from ..file_kinds import Kind


class Refused(Exception):
    """The pickle asks for a call outside the allow-list (or one with arguments it refuses)."""

    def __init__(self, name: str, why: str = "not on the allow-list") -> None:
        super().__init__(name, why)
        self.name, self.why = name, why


class Corrupt(Exception):
    """The file contradicts itself or declares something it may not."""


class Truncated(Corrupt):
    """The file ends before what it declares (or declares more than it holds)."""


class NotACheckpoint(Exception):
    """The file is something else: an image, a zip archive that torch.save did not write, a
    pickle without torch.save's magic number (``kind`` says what, and what to do if anything)."""

    def __init__(self, kind: Kind) -> None:
        super().__init__(kind.what)
        self.kind = kind
