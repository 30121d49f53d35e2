"""Hugging Face transformers as the peer: target-only `generate`, Universal Assisted Generation
(`assistant_model` + `tokenizer` + `assistant_tokenizer`, greedy) and prompt-lookup decoding, all
eager PyTorch on the same HF folders and the same prompt token ids the omnidraft runs use."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

PROMPT_LOOKUP_TOKENS = 10  # the value HF's documentation uses for prompt_lookup_num_tokens


@dataclass
class PeerRun:
    name: str
    config: dict
    prompts: int = 0
    new_tokens: int = 0
    seconds: float = 0.0
    outputs: list[list[int]] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else 0.0


class HFPeers:
    """The drafter and target loaded once as transformers models, with fast tokenizers from their
    tokenizer.json (UAG re-tokenizes text between the two vocabularies with them)."""

    def __init__(self, drafter_folder: Path, target_folder: Path, eos_ids: frozenset[int]) -> None:
        import torch
        from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        self.torch = torch
        load = dict(dtype=torch.float32, local_files_only=True, use_safetensors=True)
        self.target = AutoModelForCausalLM.from_pretrained(target_folder, **load).eval()
        self.drafter = AutoModelForCausalLM.from_pretrained(drafter_folder, **load).eval()
        self.target_tok = PreTrainedTokenizerFast(tokenizer_file=str(Path(target_folder) / "tokenizer.json"))
        self.drafter_tok = PreTrainedTokenizerFast(tokenizer_file=str(Path(drafter_folder) / "tokenizer.json"))
        self.eos = sorted(eos_ids)
        self.uag_defaults = {
            k: getattr(self.drafter.generation_config, k, None)
            for k in ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
        }

    def _configure(self, name: str, config: dict) -> None:
        if name == "hf-assisted-uag":
            # HF reads the draft length from the assistant's generation config, once per run so that
            # its own cross-call adjustments (confidence threshold) persist as they do for a user.
            gc = self.drafter.generation_config
            for k in ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold"):
                setattr(gc, k, config[k])

    def _kwargs(self, name: str, config: dict) -> dict:
        if name == "hf-assisted-uag":
            return dict(assistant_model=self.drafter, tokenizer=self.target_tok, assistant_tokenizer=self.drafter_tok)
        if name == "hf-prompt-lookup":
            return dict(prompt_lookup_num_tokens=config["prompt_lookup_num_tokens"])
        return {}

    def generate(self, name: str, config: dict, ids: list[int], max_new_tokens: int) -> list[int]:
        torch = self.torch
        x = torch.tensor([ids], dtype=torch.long)
        with torch.inference_mode():
            out = self.target.generate(
                x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=self.eos,
                pad_token_id=self.eos[0],
                **self._kwargs(name, config),
            )
        return out[0, len(ids) :].tolist()

    def job(self, name: str, config: dict, prompt_ids: list[list[int]], max_new_tokens: int):
        """An interleavable job (bench.engine.Job): greedy generation of prompt i, timed; one untimed
        warm-up call happens here."""
        from omnidraft.bench.engine import Job

        run = PeerRun(name, config)
        self._configure(name, config)
        self.generate(name, config, prompt_ids[0], min(8, max_new_tokens))

        def step(i: int) -> None:
            self._configure(name, config)  # jobs with other settings may have run in between
            t0 = time.perf_counter()
            out = self.generate(name, config, prompt_ids[i], max_new_tokens)
            run.seconds += time.perf_counter() - t0
            run.outputs.append(out)
            run.new_tokens += len(out)
            run.prompts += 1

        return Job(f"{name} {config.get('label', '')}".strip(), step, run)


def uag_configs(draft_len: int, defaults: dict) -> list[dict]:
    """UAG as a user gets it (HF defaults) and with our tuned draft length, so HF is not handicapped
    by its defaults; the faster of the two is reported."""
    resolved = {
        "num_assistant_tokens": defaults.get("num_assistant_tokens") or 20,
        "num_assistant_tokens_schedule": defaults.get("num_assistant_tokens_schedule") or "constant",
        "assistant_confidence_threshold": defaults.get("assistant_confidence_threshold") or 0.4,
        "label": "hf defaults",
    }
    tuned = {
        "num_assistant_tokens": draft_len,
        "num_assistant_tokens_schedule": "constant",
        "assistant_confidence_threshold": resolved["assistant_confidence_threshold"],
        "label": f"K={draft_len}",
    }
    return [resolved, tuned]
