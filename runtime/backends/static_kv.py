"""A static-shape graph behind the backend protocol: fixed KV buffers, fixed call widths.

NPU compilers take fixed shapes only, so such a graph (export/static_graph.py) runs ``w`` tokens
per call against a cache of exactly ``C`` positions, and the cache is not inside it: the runtime
owns ``past_key.{i}`` / ``past_value.{i}`` buffers of ``[1, H, C, D]``, passes them in whole with an
additive ``attention_bias [1, 1, w, C + w]`` that hides unwritten rows, and writes the ``w`` new rows
the graph returns (``new_key.{i}`` / ``new_value.{i}``) into place. A call shorter than ``w`` is
padded; the pad rows see nothing they could change and their outputs are dropped. Rollback is a
length: rows past it are masked until overwritten.

One session per call width (each compiled graph has one shape): a call of n tokens runs on the
narrowest width that holds n, or in chunks of the widest. Which ONNX Runtime provider runs the
sessions (CPU, or QNN's HTP through runtime/backends/qnn.py) is the caller's choice; the loop sees
the same rows either way. Imports numpy and onnxruntime only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from omnidraft.errors import ManifestError, ModelFolderError
from omnidraft.runtime.backends.base import check_forward_args, widen_for
from omnidraft.runtime.manifest import Manifest

# Added to the scores of hidden key rows. Finite so a fully hidden pad row stays a finite softmax,
# and within fp16 range (the HTP computes in fp16); exp(-1e4) is 0 in every precision.
MASK_VALUE = -1.0e4
INPUT_IDS, POSITION_IDS, ATTENTION_BIAS = "input_ids", "position_ids", "attention_bias"


def io_names(num_layers: int) -> tuple[list[str], list[str]]:
    past = [f"past_{t}.{i}" for i in range(num_layers) for t in ("key", "value")]
    new = [f"new_{t}.{i}" for i in range(num_layers) for t in ("key", "value")]
    return [INPUT_IDS, POSITION_IDS, ATTENTION_BIAS, *past], ["logits", *new]


def feeds(token_ids: Sequence[int], start_pos: int, width: int, context_len: int) -> dict[str, np.ndarray]:
    """input_ids, position_ids and attention_bias of one call of ``len(token_ids) <= width`` tokens."""
    n = len(token_ids)
    ids = np.zeros((1, width), dtype=np.int32)
    ids[0, :n] = token_ids
    pos = np.minimum(start_pos + np.arange(width, dtype=np.int32), context_len - 1)[None]
    bias = np.full((1, 1, width, context_len + width), MASK_VALUE, dtype=np.float32)
    bias[0, 0, :, :start_pos] = 0.0  # every row sees the cached prefix
    new = np.tril(np.ones((width, width), dtype=bool))  # and the new rows up to its own
    bias[0, 0, :, context_len:][new] = 0.0
    return {INPUT_IDS: ids, POSITION_IDS: pos, ATTENTION_BIAS: bias}


class StaticKvBackend:
    """``sessions``: call width -> an onnxruntime InferenceSession of that width (any provider)."""

    def __init__(self, export_dir: str | Path, manifest: Manifest, sessions: dict[int, object], *, name: str) -> None:
        info = manifest.device_info
        self.name = name
        self.manifest, self.export_dir = manifest, Path(export_dir)
        self.vocab_size = manifest.vocab_size
        self.max_seq_len = int(info["context_len"])
        self.widths = sorted(sessions)
        self._sessions = sessions
        self._in_names, self._out_names = io_names(manifest.num_layers)
        for w, s in sessions.items():
            names = [i.name for i in s.get_inputs()]
            if names != self._in_names:
                raise ManifestError(
                    f"the width-{w} graph in {export_dir} has inputs {names[:3]}…, not the static KV "
                    f"signature {self._in_names[:3]}…; re-export with `{manifest.export_command}`"
                )
        shape = (1, manifest.num_kv_heads, self.max_seq_len, manifest.head_dim)
        self._past = [np.zeros(shape, dtype=np.float32) for _ in range(2 * manifest.num_layers)]
        self._widen = widen_for(manifest, f"{export_dir}/manifest.json")
        self._len = 0

    @property
    def cached_len(self) -> int:
        return self._len

    def _width(self, n: int) -> int:
        return next((w for w in self.widths if w >= n), self.widths[-1])

    def forward(self, token_ids: Sequence[int], start_pos: int) -> np.ndarray:
        check_forward_args(self, token_ids, start_pos)
        rows, ids, pos = [], list(token_ids), start_pos
        while ids:
            w = self._width(len(ids))
            chunk, ids = ids[:w], ids[w:]
            rows.append(self._call(chunk, pos, w))
            pos += len(chunk)
        out = rows[0] if len(rows) == 1 else np.concatenate(rows)
        return out if self._widen is None else self._widen(out)

    def forward_last(self, token_ids: Sequence[int], start_pos: int) -> np.ndarray:
        return self.forward(token_ids, start_pos)[-1]

    def _call(self, chunk: list[int], start: int, width: int) -> np.ndarray:
        n = len(chunk)
        feed = feeds(chunk, start, width, self.max_seq_len)
        feed.update(zip(self._in_names[3:], self._past))
        out = self._sessions[width].run(self._out_names, feed)
        for buf, new in zip(self._past, out[1:]):
            buf[:, :, start : start + n] = new[:, :, :n]
        self._len = start + n
        return out[0][0, :n]

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self._len:
            raise ValueError(f"{self.name}: rollback to {length} but the cache holds {self._len}")
        self._len = length  # rows past it stay masked until overwritten

    def reset(self) -> None:
        self._len = 0


def graph_files(manifest: Manifest) -> dict[int, str]:
    """Call width -> the graph file the manifest names for it."""
    graphs = manifest.device_info.get("graphs")
    if not isinstance(graphs, dict) or not graphs:
        raise ManifestError(
            f"the manifest of a {manifest.device} export names no graphs; re-export with `{manifest.export_command}`"
        )
    try:
        return {int(w): str(g["model"]) for w, g in graphs.items()}
    except (KeyError, TypeError, ValueError):
        raise ManifestError(
            f"the manifest's device_info.graphs is malformed; re-export with `{manifest.export_command}`"
        ) from None


def open_sessions(export_dir: Path, manifest: Manifest, make: Callable[[Path], object], what: str) -> dict[int, object]:
    """One session per width through ``make(path)``; a graph that does not load is one clear line."""
    out = {}
    for w, name in graph_files(manifest).items():
        path = export_dir / name
        try:
            out[w] = make(path)
        except Exception as exc:  # ORT raises its own pybind types for bad files
            raise ModelFolderError(
                f"{what} cannot load {path} ({str(exc).splitlines()[0][:200]}); "
                f"re-export with `{manifest.export_command}`"
            ) from None
    return out
