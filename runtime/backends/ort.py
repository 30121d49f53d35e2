"""ONNX Runtime backend for an exported graph (see export/onnx_export.py for its signature).

The graph takes ``input_ids [1,k]`` and ``past_key_values.{i}.key|value [1,H,past,D]`` and returns
``logits [1,k,V]`` plus ``present.{i}.key|value [1,H,past+k,D]``; positions come from the past
length inside the graph. The KV cache is the list of present arrays; rollback slices it along the
sequence axis. Imports numpy and onnxruntime only (never torch), so a desktop or CI runner can use
ONNX exports without a PyTorch install.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort

from omnidraft.errors import ManifestError, ModelFolderError
from omnidraft.runtime.backends.base import check_forward_args, widen_for
from omnidraft.runtime.draft_length.head_file import token_bias_table
from omnidraft.runtime.manifest import Manifest

ACCEPT_OUTPUT = "accept_logits"
# An optional input of onnxruntime-genai exports (export/onnx_genai.py): logits only from this row on.
LOGITS_FROM = "logits_from"


class OrtBackend:
    name = "ort"

    def __init__(
        self, export_dir: str | Path, manifest: Manifest, threads: int | None = None, spin: bool = False
    ) -> None:
        if manifest.format != "onnx":
            raise ManifestError(
                f"{export_dir} holds a {manifest.format} export, not onnx; load it with its own backend"
            )
        path = Path(export_dir) / manifest.artifact_file
        opts = ort.SessionOptions()
        opts.log_severity_level = 3  # warnings about unused initializers etc. are noise here
        if threads:
            opts.intra_op_num_threads = threads
        # The drafter's and the target's sessions take turns on the same cores. Two pools that spin
        # after their runs keep each other's cores busy, which can erase the whole speedup, so pools
        # do not spin unless asked. A one-thread drafter runs on the caller's thread, and then the
        # target's pool may spin: its worker waits on the other core, which makes the target's steps
        # much faster and leaves the drafter's unchanged (docs/decisions.md).
        opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
        try:
            self.session = ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
        except Exception as exc:  # ORT raises its own pybind exception types for bad files
            raise ModelFolderError(
                f"onnxruntime cannot load {path} ({str(exc).splitlines()[0][:200]}); "
                f"re-export with `{manifest.export_command}`"
            ) from None
        names = [i.name for i in self.session.get_inputs()]
        if names != list(manifest.inputs):
            raise ManifestError(
                f"{path} has inputs {names[:3]}… but its manifest lists {manifest.inputs[:3]}…; "
                f"re-export with `{manifest.export_command}`"
            )
        self.manifest = manifest
        self.export_dir = Path(export_dir)
        self.vocab_size = manifest.vocab_size
        self.max_seq_len = manifest.max_seq_len
        # onnxruntime-genai graphs (export/onnx_genai.py) also take an all-ones attention_mask over
        # past + new positions, from which they derive positions and the causal mask.
        self._mask = "attention_mask" in names
        self._past_names = [n for n in names if n.startswith("past_key_values.")]
        # Each past input is fed the present output of the same name (the two graphs order them apart).
        self._out_names = (
            ["logits"]
            + [n.replace("past_key_values.", "present.", 1) for n in self._past_names]
            + [n for n in manifest.outputs if n == ACCEPT_OUTPUT]
        )
        missing = [n for n in self._out_names if n not in manifest.outputs]
        if names[0] != "input_ids" or missing:
            raise ManifestError(
                f"{path} does not have the input_ids/past_key_values -> logits/present signature "
                f"(missing {missing[:3]}); re-export with `{manifest.export_command}`"
            )
        # A drafter exported with --accept-head has one more output after the presents (the head
        # runs inside the graph, so adaptive drafting costs no extra call).
        self.has_accept_head = ACCEPT_OUTPUT in self._out_names
        self._accept_bias = (
            token_bias_table(manifest.accept_head, self.vocab_size, f"{export_dir}/manifest.json")
            if self.has_accept_head
            else {}
        )
        self._n_past = len(self._past_names)
        # An overridable initializer, not a required input: older exports lack it, and then a
        # prompt's pass computes every row's logits as any other call does.
        self._logits_from = LOGITS_FROM in {i.name for i in self.session.get_overridable_initializers()}
        self._pad_single_row = manifest.pad_single_row
        self._row_splits = list(manifest.row_splits)
        self._widen = widen_for(manifest, f"{export_dir}/manifest.json")
        self._empty = np.zeros((1, manifest.num_kv_heads, 0, manifest.head_dim), dtype=np.float32)
        self.reset()

    @property
    def cached_len(self) -> int:
        return self._len

    def _run(self, token_ids: Sequence[int], start_pos: int, *, logits: bool = True) -> list[np.ndarray]:
        check_forward_args(self, token_ids, start_pos)
        end = start_pos + len(token_ids)
        cuts = [c for c in self._row_splits if start_pos < c < end]
        if not cuts:
            return self._call(list(token_ids), start_pos, logits)
        # Rows on either side of a split position never share a call (runtime/manifest.py row_splits).
        parts, lo = [], start_pos
        for hi in [*cuts, end]:
            parts.append(self._call(list(token_ids[lo - start_pos : hi - start_pos]), lo, logits))
            lo = hi
        out = parts[-1]  # its presents hold the whole cache
        if not logits:
            return out
        for i in self._row_outputs(out):
            out[i] = np.concatenate([p[i] for p in parts], axis=1)
        return out

    def _row_outputs(self, out: list[np.ndarray]) -> list[int]:
        """Indices of the outputs with one row per input token: logits (and accept logits)."""
        return [0, *range(1 + self._n_past, len(out))]

    def _call(self, ids: list[int], start_pos: int, logits: bool = True) -> list[np.ndarray]:
        # A one-row call runs other kernels than a k-row one; fed twice, it gives the rows a verify
        # call gives (export/onnx_genai.py), and the copy's logits and cache row are dropped.
        pad = self._pad_single_row and len(ids) == 1
        if pad:
            ids = ids * 2
        feed = {"input_ids": np.asarray(ids, dtype=np.int64).reshape(1, -1)}
        if not logits and self._logits_from:
            feed[LOGITS_FROM] = np.asarray([len(ids) - 1], dtype=np.int64)
        if self._mask:
            feed["attention_mask"] = np.ones((1, start_pos + len(ids)), dtype=np.int64)
        # Sliced pasts are views; ORT needs contiguous buffers and copies once here.
        feed.update((n, np.ascontiguousarray(p)) for n, p in zip(self._past_names, self._past))
        out = self.session.run(self._out_names, feed)
        self._len = start_pos + len(ids) - pad
        self._past = out[1 : 1 + self._n_past]
        if pad:
            for i in self._row_outputs(out):
                out[i] = out[i][:, :1]
            self._past = [p[:, :, : self._len] for p in self._past]
        return out

    def forward(self, token_ids: Sequence[int], start_pos: int) -> np.ndarray:
        return self._rows(self._run(token_ids, start_pos)[0][0])

    def prefill(self, token_ids: Sequence[int], start_pos: int) -> None:
        self._run(token_ids, start_pos, logits=False)

    def forward_last(self, token_ids: Sequence[int], start_pos: int) -> np.ndarray:
        return self._rows(self._run(token_ids, start_pos)[0][0, -1:])[0]

    def forward_with_accept_last(self, token_ids: Sequence[int], start_pos: int) -> tuple[np.ndarray, float]:
        if not self.has_accept_head:
            raise ValueError("ort: this export has no acceptance head")
        out = self._run(token_ids, start_pos)
        return self._rows(out[0][0, -1:])[0], float(out[-1][0, -1])

    def _rows(self, logits: np.ndarray) -> np.ndarray:
        if self._widen is not None:
            return self._widen(logits)
        if logits.shape[-1] != self.vocab_size:  # a manifest whose vocab_size is not the graph's
            raise ManifestError(
                f"{self.export_dir}/manifest.json says vocab_size {self.vocab_size} but the graph returns "
                f"{logits.shape[-1]} logits a row; re-export with `{self.manifest.export_command}`"
            )
        return logits

    def forward_with_accept(self, token_ids: Sequence[int], start_pos: int) -> tuple[np.ndarray, np.ndarray]:
        """Logits and the in-graph acceptance head's logits (see base.py)."""
        if not self.has_accept_head:
            raise ValueError("ort: this export has no acceptance head")
        out = self._run(token_ids, start_pos)
        return self._rows(out[0][0]), out[-1][0]

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
