"""``--show``: the annotated frames of a video or live source in an OpenCV window as they are
written, as ultralytics' ``show=True``.

GUI toolkits want their windows driven from the main thread (Cocoa insists), so the writer thread
only :meth:`Viewer.offer`\\ s its latest annotated frame and the calling thread, between batches,
:meth:`Viewer.show`\\ s it and polls the keyboard: q (or closing the window) stops the source
as Ctrl+C does. Frames written while the model ran are not all shown: the window shows the
newest, so a slow model never makes it lag behind.
"""
from __future__ import annotations

import os
import sys
import threading

import numpy as np

from mlxnet.errors import MlxnetError

WINDOW = "mlxnet"


class Viewer:
    """One window; open it with :meth:`open`, which fails in one line where none can be shown."""

    def __init__(self, cv2) -> None:
        self._cv2 = cv2
        self._latest: np.ndarray | None = None
        self._lock = threading.Lock()
        self._shown = False  # some back ends make the window visible only with its first image

    @classmethod
    def open(cls) -> "Viewer":
        try:
            import cv2
        except ImportError:  # a declared dependency; a broken install still says what is missing
            raise MlxnetError("--show needs OpenCV: pip install opencv-python") from None
        if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
            raise MlxnetError("--show: no display here (DISPLAY and WAYLAND_DISPLAY are unset); write the video "
                              "with -o instead")
        try:
            cv2.namedWindow(WINDOW, cv2.WINDOW_NORMAL)
        except cv2.error:
            # opencv-python-headless (mlxnet's dependency: no GUI libraries to install) has no windows.
            raise MlxnetError("--show: this OpenCV has no GUI support (opencv-python-headless); "
                              "pip install opencv-python for windows, or write the video with -o") from None
        return cls(cv2)

    def offer(self, rgb: np.ndarray) -> None:
        """The newest annotated frame (any thread)."""
        with self._lock:
            self._latest = rgb

    def show(self) -> bool:
        """Draw the newest frame and poll the keyboard (the calling thread); False when the user
        asked to stop: q, Esc, or the window closed."""
        cv2 = self._cv2
        with self._lock:
            frame, self._latest = self._latest, None
        if frame is not None:
            cv2.imshow(WINDOW, cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
            self._shown = True
        key = cv2.waitKey(1) & 0xFF
        if key in (ord("q"), 27):
            return False
        if not self._shown:
            return True
        try:
            return cv2.getWindowProperty(WINDOW, cv2.WND_PROP_VISIBLE) >= 1
        except cv2.error:  # the window is gone
            return False

    def close(self) -> None:
        try:
            self._cv2.destroyWindow(WINDOW)
            self._cv2.waitKey(1)
        except Exception:  # noqa: BLE001 - closing a window that is gone
            pass
