"""The environment commands run with: the user's, minus credentials, plus non-interactive defaults.

A command the model runs, or a hook it triggers, could print or send any
variable it sees, so keys and tokens (the engine's own API key first of
all) are removed. Names are judged by their underscore-separated words, so
TOKENIZERS_PARALLELISM stays while GITHUB_TOKEN goes.
"""

from __future__ import annotations

from collections.abc import Mapping

SECRET_PREFIXES = ("RESIDENT_", "OPENAI_", "ANTHROPIC_", "HF_", "HUGGING_FACE_", "HUGGINGFACE_")
SECRET_WORDS = frozenset(
    {"TOKEN", "TOKENS", "SECRET", "SECRETS", "PASSWORD", "PASSWD", "APIKEY", "CREDENTIAL",
     "CREDENTIALS", "PASSPHRASE"}
)  # fmt: skip
SECRET_PHRASES = ("API_KEY", "PRIVATE_KEY", "ACCESS_KEY", "AUTH_KEY", "SECRET_KEY")

# Commands must never wait for a person at a prompt or open a pager.
NON_INTERACTIVE = {
    "PAGER": "cat",
    "GIT_PAGER": "cat",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_EDITOR": "true",
    "EDITOR": "true",
    "VISUAL": "true",
    "DEBIAN_FRONTEND": "noninteractive",
    "PIP_NO_INPUT": "1",
}


def is_secret_variable(name: str) -> bool:
    upper = name.upper()
    if upper.startswith(SECRET_PREFIXES):
        return True
    if any(phrase in upper for phrase in SECRET_PHRASES) or upper.endswith("_KEY"):
        return True
    return any(word in SECRET_WORDS for word in upper.split("_"))


def scrubbed_environment(
    base: Mapping[str, str], extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """`base` without secret-looking variables, with non-interactive defaults and `extra`."""
    env = {name: value for name, value in base.items() if not is_secret_variable(name)}
    env.update(NON_INTERACTIVE)
    if extra:
        env.update(extra)
    return env
