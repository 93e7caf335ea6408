"""Model ports, one module per family (installed as ``mlxnet.models``)."""
from . import resnet  # noqa: E402,F401  (registers the ResNet weight specs)
from .resnet import ResNet, resnet18, resnet34, resnet50, resnet101, resnet152  # noqa: E402,F401
from . import yolo  # noqa: E402,F401  (registers the YOLOv8 weight specs)
from .yolo import YOLO, YOLOv8, yolov8n, yolov8s, yolov8m, yolov8l, yolov8x  # noqa: E402,F401
from . import lama  # noqa: E402,F401  (registers the LaMa weight specs)
from .lama import LaMa  # noqa: E402,F401
from . import sam  # noqa: E402,F401  (registers the SAM-tiny weight spec)
from .sam import Sam, SamPredictor, sam_tiny  # noqa: E402,F401
from . import sam_family  # noqa: E402,F401  (registers the SAM model family)
