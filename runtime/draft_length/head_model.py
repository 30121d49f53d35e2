"""The acceptance-prediction head as a torch module (training, eager decoding and export).

SpecDec++'s architecture (``specdec_pp/wrap_model.py``): ``num_layers`` residual blocks
x + SiLU(Linear(x)) on the drafter's final normed hidden state, then one Linear to a single logit
(SpecDec++ uses two classes with a softmax; one logit with a sigmoid is the same model).
Row r of the drafter's hidden states is where the drafter's distribution for the *next* token
comes from, so its acceptance logit is the head's prediction for the token drafted from row r:
no extra drafter call is needed to decide whether to keep drafting.

Cross-vocabulary addition: a learned bias per drafted drafter token, added to the MLP's logit once
the token is chosen. Across vocabularies acceptance depends strongly on *which* token was drafted
(how its translation fits the target's tokenization): a per-token acceptance rate ranks
acceptances far better than the hidden-state MLP alone, and the drafter's own confidence ranks them
backwards (docs/decisions.md).
The bias stays outside the exported graph, which cannot know a sampled token: the runtime looks it
up (head_file.py).
"""

from __future__ import annotations

from pathlib import Path

import torch

from omnidraft.atomic import atomic_path, write_json
from omnidraft.runtime.draft_length.head_file import (
    HEAD_JSON,
    HEAD_WEIGHTS,
    AcceptHeadError,
    DrafterIdentity,
    HeadInfo,
    check_belongs,
    head_folder,
    head_json,
    read_head,
    sha256_file,
)

DEFAULT_LAYERS = 3
# Initial output bias: sigmoid(2) = 0.88, so an untrained head lets drafting run for a few tokens
# (1 - 0.88^k passes gamma = 0.5 at k = 6) instead of stopping after one.
INIT_BIAS = 2.0


class AcceptHead(torch.nn.Module):
    def __init__(self, hidden_size: int, num_layers: int = DEFAULT_LAYERS, vocab_size: int = 0) -> None:
        super().__init__()
        self.hidden_size, self.num_layers, self.vocab_size = hidden_size, num_layers, vocab_size
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(hidden_size, hidden_size) for _ in range(num_layers))
        self.out = torch.nn.Linear(hidden_size, 1)
        with torch.no_grad():  # residual blocks start as the identity; the output as a constant prior
            for b in self.blocks:
                b.weight.zero_()
                b.bias.zero_()
            self.out.weight.normal_(0.0, 0.01)
            self.out.bias.fill_(INIT_BIAS)
        # vocab_size 0: a head without per-token biases (heads saved before format 2).
        self.token_bias = torch.nn.Parameter(torch.zeros(vocab_size)) if vocab_size else None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., hidden] -> [...] acceptance logits before the drafted token is known (the graph's part)."""
        x = hidden
        for b in self.blocks:
            x = x + torch.nn.functional.silu(b(x))
        return self.out(x).squeeze(-1)

    def logits(self, hidden: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Acceptance logits of the drafted ``tokens`` (the MLP's logit plus each token's bias)."""
        z = self.forward(hidden)
        return z if self.token_bias is None else z + self.token_bias[tokens]

    def bias_of(self, token: int) -> float:
        return 0.0 if self.token_bias is None else float(self.token_bias.detach()[token])

    def sparse_token_bias(self) -> dict[str, float]:
        """The biases of tokens training moved (the rest are 0), keyed by token id, for JSON."""
        if self.token_bias is None:
            return {}
        b = self.token_bias.detach()
        idx = torch.nonzero(b).flatten().tolist()
        return {str(i): float(b[i]) for i in idx}


def save_head(head: AcceptHead, folder: str | Path, drafter: DrafterIdentity, training: dict | None = None) -> Path:
    """Write head.safetensors then head.json, each atomically; the json carries the weights' sha256,
    so a crash between the two leaves a head that is refused, never a silently mismatched one."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().clone() for k, v in head.state_dict().items()}
    with atomic_path(folder / HEAD_WEIGHTS) as tmp:
        save_file(state, str(tmp))
    write_json(
        folder / HEAD_JSON,
        head_json(
            head.hidden_size, head.num_layers, drafter, sha256_file(folder / HEAD_WEIGHTS), training, head.vocab_size
        ),
    )
    return folder


def load_head(
    path: str | Path, drafter: DrafterIdentity | None = None, where: str = "the drafter"
) -> tuple[AcceptHead, HeadInfo]:
    """Load a head (safetensors only), refusing one that belongs to another drafter."""
    from safetensors.torch import load_file

    info = read_head(path)
    if drafter is not None:
        check_belongs(info, drafter, where)
    head = AcceptHead(info.hidden_size, info.num_layers, info.vocab_size)
    try:
        head.load_state_dict(load_file(str(head_folder(path) / HEAD_WEIGHTS)))
    except (RuntimeError, OSError, ValueError) as exc:
        raise AcceptHeadError(
            f"{info.folder / HEAD_WEIGHTS} does not fit its {HEAD_JSON} "
            f"({str(exc).splitlines()[0][:200]}); retrain the head with omnidraft adapt --train-head"
        ) from None
    return head.eval(), info


def forward_with_head(model: torch.nn.Module, head: torch.nn.Module, **inputs):
    """The drafter and its acceptance head as one call, as the eager backend, the ONNX export and the
    parity reference run them: (the model's output, the head's logits on the final normed hidden
    state, ``hidden_states[-1]``)."""
    out = model(output_hidden_states=True, **inputs)
    return out, head(out.hidden_states[-1])
