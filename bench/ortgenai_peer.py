"""onnxruntime-genai's own generator as the peer: target-only greedy decoding of the target graph
omnidraft's ONNX Runtime rows run, from the builder's ``genai_config.json`` that ``omnidraft export``
keeps beside it (export/onnx_genai.py). It is what a user of onnxruntime-genai runs on the same
weights; it decodes one token per call, unpadded, so its output may part from ours where a
near-tied greedy choice flips (the row says whether it did).

Prompts are fed as the same token ids every other row uses, with the same thread count.
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

from omnidraft.bench.peers import PeerRun
from omnidraft.export.onnx_genai import GENAI_CONFIG

PEER_NAME = "ort-genai-target-only"


def unavailable_reason(export_dir: Path) -> str | None:
    if importlib.util.find_spec("onnxruntime_genai") is None:
        return "not installed (pip install onnxruntime-genai==0.18.0, as pyproject.toml pins it)"
    if not (Path(export_dir) / GENAI_CONFIG).is_file():
        return (
            f"no {GENAI_CONFIG} beside the target export {export_dir} (a torch.onnx graph, or an export "
            "from an older omnidraft: re-export the target)"
        )
    return None


class OrtGenaiPeer:
    """The target export loaded once by onnxruntime-genai on the CPU with ``threads`` intra-op threads."""

    def __init__(self, export_dir: Path, eos_ids: frozenset[int], *, threads: int) -> None:
        import onnxruntime_genai as og

        self.og = og
        config = og.Config(str(export_dir))
        config.clear_providers()  # the CPU, as every other row
        options = {"intra_op_num_threads": threads, "inter_op_num_threads": 1}
        config.overlay(json.dumps({"model": {"decoder": {"session_options": options}}}))
        self.model = og.Model(config)
        self.eos = set(eos_ids)
        self.threads = threads

    def generate(self, ids: list[int], max_new_tokens: int) -> list[int]:
        params = self.og.GeneratorParams(self.model)
        params.set_search_options(do_sample=False, max_length=len(ids) + max_new_tokens)
        gen = self.og.Generator(self.model, params)
        gen.append_tokens(ids)
        out: list[int] = []
        while not gen.is_done() and len(out) < max_new_tokens:
            gen.generate_next_token()
            out.append(int(gen.get_next_tokens()[0]))
            if out[-1] in self.eos:
                break
        return out

    def job(self, prompt_ids: list[list[int]], max_new_tokens: int):
        """An interleavable job (bench.engine.Job); one untimed warm-up call happens here."""
        from omnidraft.bench.engine import Job

        run = PeerRun(PEER_NAME, {"threads": self.threads})
        self.generate(prompt_ids[0], min(8, max_new_tokens))

        def step(i: int) -> None:
            t0 = time.perf_counter()
            out = self.generate(prompt_ids[i], max_new_tokens)
            run.seconds += time.perf_counter() - t0
            run.outputs.append(out)
            run.new_tokens += len(out)
            run.prompts += 1

        return Job(PEER_NAME, step, run)
