"""ONNX Runtime backend for an exported graph (see export/onnx_export.py for its signature).

The graph takes ``input_ids [1,k]`` and ``past_key_values.{i}.key|value [1,H,past,D]`` and returns
``logits [1,k,V]`` plus ``present.{i}.key|value [1,H,past+k,D]``; positions come from the past
length inside the graph. The KV cache is the list of present arrays; rollback slices it along the
sequence axis. Imports numpy and onnxruntime only (never torch), so a desktop or CI runner can use
ONNX exports without a PyTorch install.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import onnxruntime as ort

from omnidraft.errors import ManifestError, ModelFolderError
from omnidraft.runtime.accept_head import token_bias_table
from omnidraft.runtime.backends.base import check_forward_args
from omnidraft.runtime.manifest import Manifest

ACCEPT_OUTPUT = "accept_logits"


class OrtBackend:
    name = "ort"

    def __init__(self, export_dir: str | Path, manifest: Manifest, threads: int | None = None) -> None:
        if manifest.format != "onnx":
            raise ManifestError(f"{export_dir} holds a {manifest.format} export, not onnx; load it with its own backend")
        path = Path(export_dir) / manifest.artifact_file
        opts = ort.SessionOptions()
        opts.log_severity_level = 3  # warnings about unused initializers etc. are noise here
        if threads:
            opts.intra_op_num_threads = threads
        # The drafter's and the target's sessions take turns on the same cores. A pool that spins
        # after its run keeps those cores busy while the other session computes (measured on the
        # bundled pair, 2 threads: adapted code at K = 2 ran 0.97x target-only spinning, 1.31x not).
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            self.session = ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
        except Exception as exc:  # ORT raises its own pybind exception types for bad files
            raise ModelFolderError(f"onnxruntime cannot load {path} ({str(exc).splitlines()[0][:200]}); "
                                   f"re-export with `{manifest.export_command}`") from None
        names = [i.name for i in self.session.get_inputs()]
        if names != list(manifest.inputs):
            raise ManifestError(f"{path} has inputs {names[:3]}… but its manifest lists {manifest.inputs[:3]}…; "
                                f"re-export with `{manifest.export_command}`")
        self.manifest = manifest
        self.export_dir = Path(export_dir)
        self.vocab_size = manifest.vocab_size
        self.max_seq_len = manifest.max_seq_len
        self._past_names = names[1:]
        self._out_names = list(manifest.outputs)
        # A drafter exported with --accept-head has one more output after the presents (the head
        # runs inside the graph, so adaptive drafting costs no extra call).
        self.has_accept_head = ACCEPT_OUTPUT in self._out_names
        self._accept_bias = (token_bias_table(manifest.accept_head, self.vocab_size, f"{export_dir}/manifest.json")
                             if self.has_accept_head else {})
        self._n_past = len(self._past_names)
        self._empty = np.zeros((1, manifest.num_kv_heads, 0, manifest.head_dim), dtype=np.float32)
        self.reset()

    @property
    def cached_len(self) -> int:
        return self._len

    def _run(self, token_ids: Sequence[int], start_pos: int) -> list[np.ndarray]:
        check_forward_args(self, token_ids, start_pos)
        feed = {"input_ids": np.asarray(token_ids, dtype=np.int64).reshape(1, -1)}
        # Sliced pasts are views; ORT needs contiguous buffers and copies once here.
        feed.update((n, np.ascontiguousarray(p)) for n, p in zip(self._past_names, self._past))
        out = self.session.run(self._out_names, feed)
        self._past = out[1:1 + self._n_past]
        self._len = start_pos + len(token_ids)
        return out

    def forward(self, token_ids: Sequence[int], start_pos: int) -> np.ndarray:
        return self._run(token_ids, start_pos)[0][0]

    def forward_with_accept(self, token_ids: Sequence[int], start_pos: int) -> tuple[np.ndarray, np.ndarray]:
        """Logits and the in-graph acceptance head's logits (see base.py)."""
        if not self.has_accept_head:
            raise ValueError("ort: this export has no acceptance head")
        out = self._run(token_ids, start_pos)
        return out[0][0], out[-1][0]

    def accept_bias(self, token: int) -> float:
        return self._accept_bias.get(token, 0.0)

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self._len:
            raise ValueError(f"ort: rollback to {length} but the cache holds {self._len}")
        if length < self._len:
            self._past = [p[:, :, :length] for p in self._past]
            self._len = length

    def reset(self) -> None:
        self._past = [self._empty] * len(self._past_names)
        self._len = 0
