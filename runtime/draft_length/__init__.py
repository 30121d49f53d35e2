"""Draft length: how many tokens each round drafts.

- ``policy``: the per-round policy the loop asks "draft another?" (fixed K, or the acceptance head
  against a threshold gamma), the head capability as a typed protocol, the stopping rule's math;
- ``controller``: the online controller that tunes gamma and K_max between prompts (K_max 0 turns
  drafting off) from the traced rounds it is told about;
- ``calibration``: the head's per-drafted-token offsets, learned online by the controller;
- ``head_file``: the head's files and the identity of the drafter it belongs to;
- ``head_model``: the head as a torch module (training, eager decoding, export; imports torch).

Everything but ``head_model`` is pure Python, so the ONNX Runtime path runs without torch.
"""
