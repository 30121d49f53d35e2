"""ExecuTorch backend for a `.pte` exported by omnidraft.export.

Two program signatures, told apart by the manifest's input names:
- LLM path: ``forward(tokens[1,k], input_pos[1]) -> logits[1,k,V]`` (custom sdpa / update_cache ops)
- static-cache path: ``forward(input_ids[1,k], cache_position[k]) -> logits[1,k,V]``
Both hold the KV cache inside the program (mutable buffers). Writing at position p overwrites the
cache rows from p on and attention never looks past the current position, so rollback is just
bookkeeping: the next call starts at the kept length.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from omnidraft.errors import ManifestError, ModelFolderError
from omnidraft.native_output import FirstUse, without_native_lines
from omnidraft.runtime.backends.base import check_forward_args, widen_for
from omnidraft.runtime.manifest import Manifest

for _name in ("torchao", "torch.utils._pytree"):  # import-time chatter about optional CUDA kernels
    logging.getLogger(_name).setLevel(logging.ERROR)

import torch  # noqa: E402  (executorch's Python runtime exchanges torch tensors)
from executorch.runtime import Runtime  # noqa: E402


def _load_kernel_libraries(llm_ops: bool) -> None:
    """Register the non-core operators a .pte may reference (8-bit embedding lookup; the LLM
    path's custom sdpa / update_cache); without them loading fails with "Missing operator"."""
    import executorch.kernels.quantized  # noqa: F401

    if llm_ops:
        # The package __init__ does not load the kernels; this module does (and pulls in inductor,
        # hence only for programs that need it).
        from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401


class ExecuTorchBackend:
    name = "executorch"

    def __init__(self, export_dir: str | Path, manifest: Manifest) -> None:
        if manifest.format != "executorch":
            raise ManifestError(
                f"{export_dir} holds a {manifest.format} export, not executorch; load it with its own backend"
            )
        self._llm = list(manifest.inputs[:2]) == ["tokens", "input_pos"]
        _load_kernel_libraries(self._llm)
        path = Path(export_dir) / manifest.artifact_file
        try:
            with without_native_lines():  # XNNPACK's init starts ExecuTorch's threadpool, which probes the CPU
                program = Runtime.get().load_program(path)
                self._method = program.load_method("forward")
        except Exception as exc:  # the pybind layer raises RuntimeError/ValueError for bad programs
            raise ModelFolderError(
                f"ExecuTorch cannot load {path} ({str(exc).splitlines()[0][:200]}); "
                f"re-export with `{manifest.export_command}`"
            ) from None
        if self._method is None:
            raise ModelFolderError(f"{path} has no forward method; re-export with `{manifest.export_command}`")
        self.manifest = manifest
        self.export_dir = Path(export_dir)
        self.vocab_size = manifest.vocab_size
        self.max_seq_len = manifest.max_seq_len
        self._widen = widen_for(manifest, f"{export_dir}/manifest.json")
        self._len = 0
        self._first_run = FirstUse()  # a program whose load left the threadpool unstarted starts it here

    @property
    def cached_len(self) -> int:
        return self._len

    def _execute(self, token_ids: Sequence[int], start_pos: int) -> np.ndarray:
        check_forward_args(self, token_ids, start_pos)
        k = len(token_ids)
        ids = torch.tensor([list(token_ids)], dtype=torch.long)
        if self._llm:
            pos = torch.tensor([start_pos], dtype=torch.long)
        else:
            pos = torch.arange(start_pos, start_pos + k, dtype=torch.long)
        with self._first_run():
            out = self._method.execute([ids, pos])[0]
        self._len = start_pos + k
        return out[0].numpy().astype(np.float32, copy=False)

    def _rows(self, rows: np.ndarray) -> np.ndarray:
        return rows if self._widen is None else self._widen(rows)

    def forward(self, token_ids: Sequence[int], start_pos: int) -> np.ndarray:
        return self._rows(self._execute(token_ids, start_pos))

    def forward_last(self, token_ids: Sequence[int], start_pos: int) -> np.ndarray:
        return self._rows(self._execute(token_ids, start_pos)[-1:])[0]

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self._len:
            raise ValueError(f"executorch: rollback to {length} but the cache holds {self._len}")
        self._len = length

    def reset(self) -> None:
        self._len = 0
