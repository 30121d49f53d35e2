"""Chat templates: an instruct model's prompts are wrapped the way it was trained to read them.

A model folder (and an export of it) carries its template as ``chat_template.jinja`` or as
``chat_template`` in ``tokenizer_config.json``. ``render`` turns one user message into the text the
model continues, with the assistant turn opened. The drafter is given the same text: it sees the
template's markers spelled out in its own vocabulary, while the target's tokenizer reads them as its
special tokens. Rendering uses jinja2's sandbox, as transformers does, without importing
transformers (the ONNX Runtime path stays torch-free).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from omnidraft.errors import ModelFolderError

TEMPLATE_FILE = "chat_template.jinja"
CHAT_MODES = ("auto", "on", "off")


def load_template(folder: str | Path) -> str | None:
    """The folder's chat template, or None when the model has none (a base model)."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    f = folder / TEMPLATE_FILE
    if f.is_file():
        return f.read_text(encoding="utf-8")
    cfg = folder / "tokenizer_config.json"
    if cfg.is_file():
        try:
            template = json.loads(cfg.read_text(encoding="utf-8")).get("chat_template")
        except ValueError:
            raise ModelFolderError(f"{cfg} is not valid JSON; restore it from the model's source") from None
        if isinstance(template, str):
            return template
    return None


@lru_cache(maxsize=8)
def _compile(template: str):
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(template)
    except TemplateError as exc:
        raise ModelFolderError(f"the model's chat template does not parse ({exc}); fix or remove it") from None


def render(template: str, user_text: str, *, system: str | None = None) -> str:
    """The text an instruct model continues to answer ``user_text`` (the assistant turn opened).
    The BOS token is left to the tokenizer's own start ids, so the template must not add it twice."""
    from jinja2 import TemplateError

    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user_text}]
    try:
        return _compile(template).render(messages=messages, add_generation_prompt=True, bos_token="", eos_token="")
    except TemplateError as exc:
        raise ModelFolderError(f"the model's chat template failed on a prompt ({exc}); fix or remove it") from None


def wrap(folder: str | Path, text: str, mode: str = "auto") -> str:
    """``text`` as the target in ``folder`` should read it: rendered where the model has a template
    (mode "auto"; "on" requires one, "off" never renders)."""
    if mode not in CHAT_MODES:
        from omnidraft.errors import InvalidArgument

        raise InvalidArgument(f"unknown chat mode {mode!r}; choose one of {', '.join(CHAT_MODES)}")
    if mode == "off":
        return text
    template = load_template(folder)
    if template is None:
        if mode == "on":
            raise ModelFolderError(f"{folder} has no chat template; use --chat off or auto for a base model")
        return text
    return render(template, text)
