"""What the HTTP layer needs to know about the one model it serves.

Kept apart from the engine so the app can be built over any object that
streams RequestOutputs (tests use a scripted fake engine), and so the chat
layer reads the model's type and template in one place.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.chat.tool_text import read_model_type

if TYPE_CHECKING:
    from engine.async_engine import AsyncEngine


def template_text(tokenizer: Any) -> str | None:
    """The default chat template as text (tokenizers may hold a dict of named templates)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        return template.get("default") or next(iter(template.values()), None)
    return template


@dataclass
class ServedModel:
    names: list[str]  # the first is the id /v1/models lists; all are accepted in requests
    tokenizer: Any
    max_context_tokens: int  # prompt plus output, per request
    capacity_tokens: int  # what the KV pool holds; a request longer than this can never run
    model_type: str | None = None
    chat_template: str | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    # The EngineConfig the engine runs with, for /v1/engine/stats: which settings are in
    # force (e.g. speculative), as SGLang's /get_server_info tells its server arguments.
    settings: dict[str, Any] = field(default_factory=dict)
    # The model folder (config.json, weights, tokenizer) and config.json's architectures,
    # for the routers' /model_info (a router on this machine loads the tokenizer there).
    model_path: str | None = None
    architectures: list[str] = field(default_factory=list)

    @property
    def id(self) -> str:
        return self.names[0]

    def accepts(self, name: str | None) -> bool:
        return name is None or name in self.names

    @classmethod
    def from_engine(cls, async_engine: AsyncEngine, name: str) -> ServedModel:
        """Describe the model an AsyncEngine loaded, served under `name` and its folder's name."""
        engine = async_engine.engine
        model_dir = Path(engine.model_dir)
        names = [name]
        for alias in (Path(name).name, model_dir.name):
            if alias and alias not in names:
                names.append(alias)
        return cls(
            names=names,
            tokenizer=engine.tokenizer,
            max_context_tokens=engine.max_model_len,
            capacity_tokens=engine.capacity_tokens,
            model_type=read_model_type(model_dir),
            chat_template=template_text(engine.tokenizer),
            settings=engine.config.model_dump(mode="json"),
            model_path=str(model_dir),
            architectures=read_architectures(model_dir),
        )


def read_architectures(model_dir: Path) -> list[str]:
    """config.json's `architectures` (empty when it names none)."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return []
    names = config.get("architectures") if isinstance(config, dict) else None
    return [str(name) for name in names] if isinstance(names, list) else []
