"""The LoRA step as an ExecuTorch training program (forward + backward of the hybrid loss).

``torch.export.export(strict=True)`` -> ``_export_forward_backward`` (joint graph, loss = output 0)
-> ``to_edge().to_executorch()``; run with ExecuTorch's training runtime, which returns the loss and
the gradient of every trainable parameter (the LoRA A/B matrices; the frozen base weights are
constants of the program). The optimizer (AdamW) runs outside on those gradients, and the updated
values are written back into the program's parameter tensors, which alias its memory.
"""

from __future__ import annotations

import hashlib
import logging
import warnings

import torch

from omnidraft.errors import ExportError
from omnidraft.native_output import without_native_lines

from .loss import Batch, LossModule


def _replace_empty_permuted(gm: torch.fx.GraphModule) -> None:
    """SiLU's backward decomposes into ``empty_permuted`` (not core ATen, no ExecuTorch kernel);
    with the identity permutation it is a plain ``empty``."""
    g = gm.graph
    for n in list(g.nodes):
        if n.target != torch.ops.aten.empty_permuted.default:
            continue
        size, perm = n.args[:2]
        if list(perm) != list(range(len(perm))):
            raise ExportError(
                "the training graph needs a permuted empty tensor, which ExecuTorch cannot run; use --engine eager"
            )
        with g.inserting_before(n):
            new = g.call_function(
                torch.ops.aten.empty.memory_format,
                (size,),
                {"dtype": n.kwargs.get("dtype"), "device": n.kwargs.get("device")},
            )
        new.meta = dict(n.meta)
        n.replace_all_uses_with(new)
        g.erase_node(n)
    gm.recompile()


def build_training_program(module: LossModule, example: Batch) -> bytes:
    """Serialised .pte bytes of the forward+backward program for batches shaped like ``example``."""
    for name in ("torch._export", "torch.export", "torch._dynamo"):
        logging.getLogger(name).setLevel(logging.ERROR)
    config = _hf_config(module.model)
    saved = config._attn_implementation if config is not None else None
    with warnings.catch_warnings():
        # torch.export's own deprecations (pytree LeafSpec) and dynamo's note on transformers' output
        # capturing: raised inside the libraries, nothing a user of omnidraft can act on.
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", message="While compiling, we found certain side effects")
        return _build(module, example, config, saved)


def _build(module: LossModule, example: Batch, config, saved) -> bytes:
    from executorch.exir import to_edge
    from torch.export.experimental import _export_forward_backward

    try:
        # The fused SDPA kernel's backward is no core ATen op; the eager attention computes the same
        # softmax(QK^T)V from core ops only.
        if config is not None:
            config._attn_implementation = "eager"
        ep = torch.export.export(module, example.inputs(), strict=True)
        ep = _export_forward_backward(ep)
        _replace_empty_permuted(ep.graph_module)
        return to_edge(ep).to_executorch().buffer
    except ExportError:
        raise
    except Exception as exc:  # torch.export/exir raise many internal types
        first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
        raise ExportError(
            f"exporting the LoRA training step to ExecuTorch failed ({first[:200]}); use --engine eager"
        ) from exc
    finally:
        if config is not None:
            config._attn_implementation = saved


def _hf_config(model: torch.nn.Module):
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(base, "config", None)


# Programs built in this process, by (frozen weights + trainable layout, batch shape, top-k): the demo
# and the bench adapt one base drafter once per stream, and lowering costs far more than a step.
# A program enters the memo only after its first call: before that, the runtime cannot take parameter
# values (see _sync) and would run with the values of the module it was exported from.
_PROGRAMS: dict[tuple, tuple[bytes, object]] = {}


def program_key(module: LossModule, example: Batch) -> tuple:
    h = hashlib.sha256()
    for name, p in module.named_parameters():
        h.update(f"{name}:{tuple(p.shape)}:{p.requires_grad}".encode())
        if not p.requires_grad:  # frozen weights are constants baked into the program
            h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
    for name, b in module.named_buffers():  # the intersection ids, rotary tables: constants too
        h.update(f"{name}:{b.dtype}:{tuple(b.shape)}".encode())
        h.update(b.detach().contiguous().numpy().tobytes())
    # The divergence is code, not a tensor: two losses over the same weights are two programs.
    return h.hexdigest(), module.divergence, tuple(example.ids.shape), int(example.topk_idx.shape[-1])


class ExecuTorchStep:
    """Loss and gradients from an ExecuTorch training program; parameters are kept in sync with
    the eager model that the optimizer updates."""

    def __init__(self, module: LossModule, example: Batch) -> None:
        from executorch.extension.training import _load_for_executorch_for_training_from_buffer

        self.key = program_key(module, example)
        self.reused = self.key in _PROGRAMS
        if self.reused:
            self.program, self.runtime = _PROGRAMS[self.key]
        else:
            self.program = build_training_program(module, example)
            with without_native_lines():
                self.runtime = _load_for_executorch_for_training_from_buffer(self.program)
        self.shape = tuple(example.ids.shape)
        self.k = int(example.topk_idx.shape[-1])
        # Program names carry the LossModule's "model." prefix.
        self.params = {f"model.{n}": p for n, p in module.model.named_parameters() if p.requires_grad}

    def _sync(self) -> None:
        """Write the eager parameters into the program (its tensors alias the program's memory)."""
        try:
            named = self.runtime.named_parameters()
        except RuntimeError:
            return  # before the first call the program still holds the values it was exported with
        with torch.no_grad():
            for name, t in named.items():
                t.copy_(self.params[name].detach())

    def __call__(self, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        if tuple(batch.ids.shape) != self.shape:
            raise ValueError(f"batch shape {tuple(batch.ids.shape)} != program shape {self.shape}")
        self._sync()
        with without_native_lines():  # the first call starts ExecuTorch's threadpool, which probes the CPU
            loss = self.runtime.forward_backward("forward", batch.inputs())[0]
        _PROGRAMS.setdefault(self.key, (self.program, self.runtime))
        grads = {name[len("model.") :]: g for name, g in self.runtime.named_gradients().items()}
        return loss, grads
