"""ExecuTorch `.pte` (XNNPACK) with the KV cache inside the program.

General path for every supported architecture: transformers' ``TorchExportableModuleWithStaticCache``
wraps the model with a StaticCache of ``max_seq_len`` rows registered as mutable buffers. One method
``forward(input_ids[1,k], cache_position[k]) -> logits[1,k,V]`` with k dynamic in [1, max_seq_len]
does prefill, decode and k-token verification; rollback is calling again at an earlier position.
``strict=True`` because the non-strict trace of the cache writes does not lower to XNNPACK.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from transformers import GenerationConfig

from omnidraft.errors import ExportError

INPUTS = ["input_ids", "cache_position"]
OUTPUTS = ["logits"]


def export_pte(model: torch.nn.Module, max_seq_len: int, path: Path) -> None:
    """torch.export -> to_edge_transform_and_lower(XNNPACK) -> .pte written to ``path``."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    model.generation_config = GenerationConfig(
        use_cache=True, cache_implementation="static",
        cache_config={"batch_size": 1, "max_cache_len": max_seq_len})
    wrapped = TorchExportableModuleWithStaticCache(model, batch_size=1, max_cache_len=max_seq_len)
    k = torch.export.Dim("k", min=1, max=max_seq_len)
    # A sample k of 2: sizes 0 and 1 would be specialised by the tracer.
    sample = {"input_ids": torch.zeros(1, 2, dtype=torch.long), "cache_position": torch.arange(2)}
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            program = torch.export.export(wrapped, args=(), kwargs=sample, strict=True,
                                          dynamic_shapes={"input_ids": {1: k}, "cache_position": {0: k}})
            lowered = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()]).to_executorch()
    except Exception as exc:  # torch.export / exir raise many unrelated types
        raise ExportError(f"ExecuTorch lowering failed: {str(exc).splitlines()[0][:300]}; "
                          "try --quant fp32 or report the model config") from exc
    with open(path, "wb") as f:
        lowered.write_to_file(f)
