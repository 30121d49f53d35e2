"""Run onnxruntime-genai's model builder with the config shims our transformers version needs.

transformers 5.23 writes Gemma 3's rope settings per layer type (``rope_parameters`` =
``{"full_attention": {...}, "sliding_attention": {...}}``), while the builder's Gemma 3 class reads
the older flat form (``rope_parameters["rope_type"]``, ``rope_theta``, ``rope_local_base_freq``) and
stops with ``KeyError: 'rope_type'``. The shim flattens the config the builder is handed, nothing
else: the graph is the builder's own.

    python -m omnidraft.export.genai_builder <the builder's arguments>
"""

from __future__ import annotations

import os
import runpy
import sys


def _flatten_rope(config) -> None:
    rope = getattr(config, "rope_parameters", None)
    if isinstance(rope, dict) and "full_attention" in rope:
        config.rope_local_base_freq = rope["sliding_attention"]["rope_theta"]
        config.rope_parameters = dict(rope["full_attention"])
        config.rope_theta = rope["full_attention"]["rope_theta"]


def main() -> None:
    import onnxruntime_genai.models as genai_models

    # builder.py imports its model classes as the top-level package `builders`: patch that one.
    sys.path.insert(0, os.path.dirname(genai_models.__file__))
    from builders import gemma

    init = gemma.Gemma3Model.__init__

    def patched(self, config, *args, **kwargs):
        _flatten_rope(config)
        init(self, config, *args, **kwargs)

    gemma.Gemma3Model.__init__ = patched
    sys.argv = ["onnxruntime_genai.models.builder", *sys.argv[1:]]
    runpy.run_module("onnxruntime_genai.models.builder", run_name="__main__")


if __name__ == "__main__":
    main()
