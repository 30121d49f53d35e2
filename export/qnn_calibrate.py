"""QDQ quantization of the static graphs for the HTP, calibrated on the pair's own text.

ONNX Runtime's QNN quantization recipe (``get_qnn_qdq_config``: the overrides that keep every op in
a type the HTP takes) with 16-bit activations and 8-bit weights. Calibration runs the fp32 static
graphs on the CPU over the streams' train split (prompt and reference text, never a held-out
prompt), teacher-forced so the cache inputs hold what decoding would put there, and records each
width's inputs as it goes: prefill chunks, one-token steps and multi-token calls alike.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from omnidraft.errors import DataError, ExportError
from omnidraft.runtime.backends.static_kv import StaticKvBackend

PROMPTS_PER_STREAM = 2
MAX_SAMPLES = 48  # per width: MinMax over more adds calibration time and little range


class _Recorder:
    """An InferenceSession that keeps a copy of every feed it runs (the past buffers are reused)."""

    def __init__(self, session) -> None:
        self.session, self.feeds = session, []

    def get_inputs(self):
        return self.session.get_inputs()

    def run(self, names, feed):
        self.feeds.append({k: v.copy() for k, v in feed.items()})
        return self.session.run(names, feed)


class _Reader:
    """onnxruntime.quantization's CalibrationDataReader over recorded feeds."""

    def __init__(self, feeds: list[dict]) -> None:
        self._it = iter(feeds)

    def get_next(self):
        return next(self._it, None)


def calibration_texts() -> list[str]:
    from omnidraft.models.streams import STREAMS, load_stream

    try:
        return [p.prompt + p.reference for s in STREAMS for p in load_stream(s, "train")[:PROMPTS_PER_STREAM]]
    except DataError as exc:
        raise DataError(f"QDQ calibration reads the streams' train split: {exc}") from None


def _record(backend: StaticKvBackend, ids: list[int]) -> None:
    """Prefill half the text, then the rest in calls cycling through every width, teacher-forced."""
    backend.reset()
    ids = ids[: backend.max_seq_len]
    half = len(ids) // 2
    backend.forward(ids[:half], 0)
    pos, turn = half, 0
    while pos < len(ids):
        n = min(backend.widths[turn % len(backend.widths)], len(ids) - pos)
        backend.forward(ids[pos : pos + n], pos)
        pos, turn = pos + n, turn + 1


def quantize_qdq(prov, info, src: Path, dst: Path, *, names: dict[int, str], quant: str) -> None:
    """Write the QDQ graph of every width in ``names`` from ``src`` into ``dst``."""
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config
    from tokenizers import Tokenizer

    if quant != "a16w8":
        raise ExportError(f"no QDQ recipe for {quant!r}")
    rec = {
        w: _Recorder(ort.InferenceSession(str(src / n), providers=["CPUExecutionProvider"])) for w, n in names.items()
    }
    backend = StaticKvBackend(src, replace(prov, draft_vocab={}), rec, name="calibration")
    tok = Tokenizer.from_file(str(info.folder / "tokenizer.json"))
    for text in calibration_texts():
        _record(backend, tok.encode(text, add_special_tokens=False).ids)
    for w, name in names.items():
        feeds = rec[w].feeds
        if not feeds:
            raise ExportError(f"QDQ calibration ran no width-{w} call; the calibration texts are too short")
        keep = np.linspace(0, len(feeds) - 1, min(MAX_SAMPLES, len(feeds))).round().astype(int)
        config = get_qnn_qdq_config(
            str(src / name),
            _Reader([feeds[i] for i in sorted(set(keep))]),
            activation_type=QuantType.QUInt16,
            weight_type=QuantType.QUInt8,
        )
        try:
            quantize(str(src / name), str(dst / name), config)
        except Exception as exc:  # the quantizer raises many types
            raise ExportError(f"QDQ quantization of {name} failed: {str(exc).splitlines()[0][:240]}") from exc
