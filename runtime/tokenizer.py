"""The engine's tokenizer (tokenizer.json through `tokenizers`) and chat template (Jinja, as transformers renders it)."""

from __future__ import annotations

import json
from pathlib import Path

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from atlas.runtime.errors import EngineError


def _raise_exception(message: str):
    raise TemplateError(message)


class EngineTokenizer:
    def __init__(self, engine_dir: Path):
        engine_dir = Path(engine_dir)
        path = engine_dir / "tokenizer.json"
        if not path.is_file():
            raise EngineError(
                f"engine {engine_dir} has no tokenizer (its checkpoint shipped none); pass token ids instead, "
                f"e.g. atlas-run logits {engine_dir} --token-ids 1,2,3 --output out.npy"
            )
        self.tokenizer = Tokenizer.from_file(str(path))
        config_path = engine_dir / "tokenizer_config.json"
        self.config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        template = self.config.get("chat_template")
        jinja_path = engine_dir / "chat_template.jinja"
        if template is None and jinja_path.is_file():
            template = jinja_path.read_text()
        if isinstance(template, list):  # named templates: take the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        self.chat_template: str | None = template

    def _special(self, key: str) -> str | None:
        tok = self.config.get(key)
        return tok.get("content") if isinstance(tok, dict) else tok

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The chat template applied to messages [{"role", "content"}], as transformers renders it."""
        if self.chat_template is None:
            raise EngineError("this engine's tokenizer has no chat template; run with --no-chat.")
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
        env.globals["raise_exception"] = _raise_exception
        env.filters["tojson"] = lambda x, indent=None, **kw: json.dumps(x, indent=indent, ensure_ascii=False)
        return env.from_string(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=self._special("bos_token") or "", eos_token=self._special("eos_token") or "",
        )

    def encode_chat(self, messages: list[dict]) -> list[int]:
        # The template already holds the special tokens; transformers encodes it without adding more.
        return self.encode(self.render_chat(messages), add_special_tokens=False)

    def stream(self) -> "TextStream":
        return TextStream(self.tokenizer)


class TextStream:
    """Turns generated ids into text chunks as soon as they decode (multi-byte characters wait)."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.decoder = DecodeStream(skip_special_tokens=True)

    def push(self, token_id: int) -> str:
        return self.decoder.step(self.tokenizer, token_id) or ""
