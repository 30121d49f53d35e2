"""Model backends behind one protocol (see base.py). Import concrete backends lazily so the
ONNX Runtime path never imports torch."""
