"""Quality gate: a quantized artifact against its own fp32 model on held-out text.

The parity gate (parity.py) compares an artifact with the same quantization simulated in eager
PyTorch, so it catches lowering bugs but not quantization damage. This gate measures the damage
itself, the way a user would see it: teacher-forced over passages written for this purpose (code,
prose, a worked word problem; in no training corpus), the artifact's greedy choice is compared with
the fp32 model's at every position, and the perplexity of each on the passage gives their ratio.
Both figures go into the manifest.

A near-untrained model (a random test model) predicts the text so badly that agreement between two
versions of it means nothing: its figures are recorded, and the gate applies only where the fp32
model's perplexity on the passages is at least ``MIN_GAIN`` times below a uniform guess over its
vocabulary.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from omnidraft.errors import ExportError

PASSAGES = (
    '''import heapq
from dataclasses import dataclass, field


@dataclass(order=True)
class Job:
    priority: int
    name: str = field(compare=False)
    attempts: int = field(default=0, compare=False)


class JobQueue:
    """A priority queue of jobs that retries a failed job at most three times."""

    def __init__(self, max_attempts: int = 3) -> None:
        self._heap: list[Job] = []
        self.max_attempts = max_attempts

    def push(self, job: Job) -> None:
        heapq.heappush(self._heap, job)

    def pop(self) -> Job | None:
        return heapq.heappop(self._heap) if self._heap else None

    def retry(self, job: Job) -> bool:
        job.attempts += 1
        if job.attempts >= self.max_attempts:
            return False
        self.push(job)
        return True

    def __len__(self) -> int:
        return len(self._heap)
''',
    """The lighthouse keeper had not spoken to anyone for eleven days when the supply boat finally \
rounded the northern point. She watched it from the gallery, one hand on the cold iron rail, counting \
the strokes of the oars the way her father had taught her. The sea was calm for once, a flat grey sheet \
that reflected the clouds, and the gulls had gone quiet. When the boat touched the landing she walked \
down the hundred and twelve steps without hurrying. The young man at the oars handed her a crate of \
tinned fish, two sacks of flour, a bundle of letters tied with string and, to her surprise, a small \
pot of red geraniums. "From the harbour master's wife," he said. "She thought you might want something \
alive up here." The keeper thanked him, set the pot on the window sill of the kitchen and, for the \
first time that winter, did not feel the long evening ahead as a weight.""",
    """Question: A bakery sells muffins for $3 each and cookies for $2 each. On Saturday it sold 48 \
muffins and twice as many cookies. On Sunday it sold 15 fewer muffins than on Saturday and the same \
number of cookies as on Saturday. How much money did the bakery make over the two days?
Answer: On Saturday the bakery sold 48 muffins, which brought in 48 * 3 = $144. It sold twice as many \
cookies, so 48 * 2 = 96 cookies, which brought in 96 * 2 = $192. Saturday's total was 144 + 192 = $336.
On Sunday it sold 48 - 15 = 33 muffins, which brought in 33 * 3 = $99. It sold 96 cookies again, \
which brought in $192. Sunday's total was 99 + 192 = $291.
Over the two days the bakery made 336 + 291 = $627.
The answer is 627.""",
)

# Gate bars, for models that predict the passages (fp32 perplexity below vocabulary / MIN_GAIN).
# int8 weights keep >= 0.97 of greedy choices on the real targets and int4 >= 0.85 (see models/README.md);
# 0.80 / 1.30 refuse a broken or badly damaged artifact without refusing ordinary int4 noise.
MIN_TOP1_VS_FP32 = 0.80
MAX_PPL_RATIO = 1.30
MIN_GAIN = 10.0


def gate_sequences(tokenizer_file: Path, start_ids: tuple[int, ...], max_len: int) -> list[list[int]]:
    """Each passage as the model's tokens (after its start ids), cut to fit one call of ``max_len``."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_file))
    return [(list(start_ids) + tok.encode(p, add_special_tokens=False).ids)[:max_len] for p in PASSAGES]


def _nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z -= z.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return -logp[np.arange(len(targets)), targets]


def measure(artifact_run, fp32_run, sequences: list[list[int]]) -> dict:
    """``*_run(ids) -> logits [len, V]``; figures over every next-token position of every passage."""
    agree, nll_q, nll_f, n, vocab = 0, 0.0, 0.0, 0, 0
    for ids in sequences:
        got, ref = artifact_run(ids[:-1]), fp32_run(ids[:-1])
        v = vocab = min(got.shape[-1], ref.shape[-1])
        targets = np.asarray(ids[1:])
        agree += int((got[:, :v].argmax(-1) == ref[:, :v].argmax(-1)).sum())
        nll_q += float(_nll(got[:, :v], targets).sum())
        nll_f += float(_nll(ref[:, :v], targets).sum())
        n += len(targets)
    ppl_q, ppl_f = math.exp(nll_q / n), math.exp(nll_f / n)
    return {
        "text_tokens": n,
        "top1_vs_fp32": agree / n,
        "ppl_fp32": ppl_f,
        "ppl": ppl_q,
        "ppl_ratio": ppl_q / ppl_f,
        "gated": ppl_f * MIN_GAIN < vocab,
    }


def passes(fig: dict, *, min_top1: float = MIN_TOP1_VS_FP32, max_ppl_ratio: float = MAX_PPL_RATIO) -> bool:
    ok = math.isfinite(fig["ppl"]) and fig["top1_vs_fp32"] >= min_top1 and fig["ppl_ratio"] <= max_ppl_ratio
    return ok or not fig["gated"]


def check(fig: dict, what: str, *, min_top1: float = MIN_TOP1_VS_FP32, max_ppl_ratio: float = MAX_PPL_RATIO) -> None:
    if not passes(fig, min_top1=min_top1, max_ppl_ratio=max_ppl_ratio):
        raise ExportError(
            f"quality gate failed: {what} keeps {fig['top1_vs_fp32']:.1%} of the fp32 model's greedy choices "
            f"(needs {min_top1:.0%}) and multiplies its perplexity by {fig['ppl_ratio']:.3f} (at most "
            f"{max_ppl_ratio:.2f}) on held-out text; quantization damages this model too much: use a finer quant "
            "(int8 for int4, 8da8w for 8da4w)"
        )


# Where the quality gate applies, quantization damage is judged on held-out text against fp32, and
# the parity comparison with the quantized eager reference (parity.py) only has to catch a broken
# lowering. That reference cannot model every kernel's arithmetic (int8-activation MatMulNBits,
# fused attention): on Qwen2.5-0.5B the int4 builder graph agreed with it on 78 % of the 41 parity
# positions, where the int8 graph agreed on 98 %.
LOWERING_TOP1 = 0.5


def parity_bar(fig: dict | None, threshold: float) -> float:
    """The top-1 bar of the quantized-reference comparison, given this gate's figures."""
    return min(threshold, LOWERING_TOP1) if fig is not None and fig["gated"] else threshold


def measure_run(run, model, info, max_seq_len: int) -> dict:
    """``run(ids) -> logits`` (an artifact, or a quantized module in eager mode) against the fp32 HF
    ``model`` on the passages."""
    from omnidraft.runtime.tokenizer import load_codec

    from .parity import hf_logits

    codec = load_codec(info.folder / "tokenizer.json")
    seqs = gate_sequences(info.folder / "tokenizer.json", codec.start_ids, max_seq_len)
    return measure(run, hf_logits(model), seqs)


def measure_artifact(backend, model, info, max_seq_len: int) -> dict:
    """``backend`` (the artifact through the runtime) against the fp32 HF ``model`` on the passages."""

    def artifact_run(ids: list[int]) -> np.ndarray:
        backend.reset()
        return backend.forward(ids, 0)

    fig = measure_run(artifact_run, model, info, max_seq_len)
    backend.reset()
    return fig
