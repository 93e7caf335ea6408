"""The models behind ``mlxnet erase`` and ``mlxnet app``: each loaded on first use, once per
process, on the default device, and shared by every image and request."""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable

from mlxnet.errors import MlxnetError

DEFAULT_WEIGHTS = {"sam": "sam-tiny", "lama": "lama", "yolo": "yolov8n", "resnet": "resnet50"}


class ModelUnavailable(MlxnetError):
    """A model of the server's (or the command's) own configuration cannot be loaded: not the
    request's fault (the app answers 503), and the message names the option that chose it."""


@dataclass(frozen=True)
class Weights:
    """Where each model's weights come from: an id, a file or ``random`` (as ``--weights``)."""

    sam: str = DEFAULT_WEIGHTS["sam"]
    lama: str = DEFAULT_WEIGHTS["lama"]
    yolo: str = DEFAULT_WEIGHTS["yolo"]
    resnet: str = DEFAULT_WEIGHTS["resnet"]
    dtype: str = "float32"

    def to_dict(self) -> dict:
        return {"sam": self.sam, "lama": self.lama, "yolo": self.yolo, "resnet": self.resnet, "dtype": self.dtype}


class Models:
    """``sam()`` (a SAM predictor; each image gets its own ``fresh()`` one on the same weights),
    ``lama()``, ``yolo()`` (a :class:`~mlxnet.models.yolo.YOLO` detector) and ``classifier()``
    (ResNet), each built by its family's loader the first time it is asked for. A loader's error
    is one line, and asking again tries again (a missing file may have been put in place)."""

    def __init__(self, weights: Weights | None = None) -> None:
        self.weights = weights or Weights()
        self._loaded: dict[str, Any] = {}
        self._lock = threading.Lock()  # two first requests at once load a model once

    def _get(self, name: str, make: Callable[[], Any]) -> Any:
        with self._lock:
            if name not in self._loaded:
                from mlxnet.commands.images import load_model

                try:
                    self._loaded[name] = load_model(make)
                except MlxnetError as e:
                    raise ModelUnavailable(f"--{name}-weights {getattr(self.weights, name)}: {e}") from None
            return self._loaded[name]

    def sam(self):
        from mlxnet import families

        return self._get("sam", lambda: families.family_of("sam-tiny").predictor(self.weights.sam, "sam-tiny",
                                                                                 self.weights.dtype))

    def lama(self):
        from mlxnet import families

        return self._get("lama", lambda: families.family_of("lama").predictor(self.weights.lama, None,
                                                                              self.weights.dtype))

    def yolo(self):
        from mlxnet import families

        return self._get("yolo", lambda: families.family_of("yolov8n").predictor(self.weights.yolo, None,
                                                                                 self.weights.dtype))

    def classifier(self):
        from mlxnet import families

        return self._get("resnet", lambda: families.family_of("resnet50").predictor(self.weights.resnet, None,
                                                                                    self.weights.dtype))

    def loaded(self) -> list[str]:
        return sorted(self._loaded)

    def preload(self, names: list[str]) -> "Models":
        """Load these now (``sam``, ``lama``, ``yolo``, ``resnet``): a command fails before its
        first image rather than on each."""
        loaders = {"sam": self.sam, "lama": self.lama, "yolo": self.yolo, "resnet": self.classifier}
        for name in names:
            loaders[name]()
        return self
