"""2-D real FFTs over the H and W axes of NHWC maps (LaMa's FourierUnit): ``rfft2`` / ``irfft2``
(complex64 spectra, as ``mx.fft``) and ``rfft2_planar`` / ``irfft2_planar`` (float32 planes).

No registered op: each function is one MLX composition (:mod:`.definition`), dense DFT GEMMs for
small maps and ``mx.fft`` for larger ones, the same on every back end.
"""
from .definition import irfft2, irfft2_planar, rfft2, rfft2_planar

__all__ = ["irfft2", "irfft2_planar", "rfft2", "rfft2_planar"]
