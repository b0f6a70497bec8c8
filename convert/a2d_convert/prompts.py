"""Prompt text -> token ids and ids -> text, per docs/model-format.md "Tokenizer and prompts".

The tokenizer is the `tokenizers` library over the folder's tokenizer.json. The chat template is
rendered with jinja2 in exactly the environment transformers' `apply_chat_template` builds
(sandboxed, trim_blocks, lstrip_blocks, loopcontrols, its `tojson`, `raise_exception` and
`strftime_now`, the special tokens as variables), without importing transformers: that import costs
seconds on every CLI call, and tests check the two renderings agree.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from .config import read_json
from .errors import A2DError

SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


@dataclass
class PromptCodec:
    tokenizer: "tokenizers.Tokenizer"  # noqa: F821
    chat_template: str | None
    special_tokens: dict[str, str]
    source: Path

    def encode_plain(self, text: str) -> list[int]:
        """With the tokenizer's own special tokens (its post-processor decides, e.g. a BOS)."""
        return self.tokenizer.encode(text, add_special_tokens=True).ids

    def render_chat(self, messages: list[dict], enable_thinking: bool | None = None, add_generation_prompt: bool = True) -> str:
        """The template's text for MESSAGES; with the generation prompt for a reply to be decoded, without
        it for a whole conversation (training data)."""
        if self.chat_template is None:
            raise A2DError(
                f"{self.source}: no chat template (tokenizer_config.json 'chat_template' or chat_template.jinja); "
                "add one or drop --chat"
            )
        extra = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
        try:
            return _compile(self.chat_template).render(
                messages=messages,
                tools=None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **{**self.special_tokens, **extra},
            )
        except Exception as error:  # jinja2 raises many types; all mean the template cannot render this chat
            raise A2DError(f"{self.source}: the chat template failed to render ({error}); fix the template") from None

    def encode_chat(self, messages: list[dict], enable_thinking: bool | None = None) -> list[int]:
        """The template has the special tokens, so none are added."""
        return self.tokenizer.encode(self.render_chat(messages, enable_thinking), add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def load_prompt_codec(model_dir: Path) -> PromptCodec:
    from tokenizers import Tokenizer

    model_dir = Path(model_dir)
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        raise A2DError(f"{path}: file not found; copy the base model's tokenizer.json into the model folder")
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as error:  # the Rust side reports parse errors as plain Exception
        raise A2DError(f"{path}: not a readable tokenizer ({str(error).splitlines()[0]}); restore it from the base model") from None
    config_path = model_dir / "tokenizer_config.json"
    tok_config = read_json(config_path) if config_path.is_file() else {}
    return PromptCodec(tokenizer, _chat_template(model_dir, tok_config), _special_tokens(tok_config), model_dir)


def _chat_template(model_dir: Path, tok_config: dict) -> str | None:
    jinja_file = model_dir / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = tok_config.get("chat_template")
    if isinstance(template, list):  # named templates, as some tokenizer_config.json files carry
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    return template if isinstance(template, str) else None


def _special_tokens(tok_config: dict) -> dict[str, str]:
    found = {}
    for name in SPECIAL_TOKEN_NAMES:
        value = tok_config.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            found[name] = value
    return found


_compiled: dict[str, object] = {}


def _compile(template: str):
    if template not in _compiled:
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        _compiled[template] = env.from_string(template)
    return _compiled[template]
