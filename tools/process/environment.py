"""The environments child processes get: an allow-list for shell commands, a scrub for git.

A command the model runs, or a hook it triggers, could print or send any
variable it sees. Shell commands therefore get only what an allow-list
names (PATH, locale, terminal, toolchain locations, and what the user adds);
nothing that happens to be exported in the agent's shell reaches them. The
git tools keep the user's environment (identity, signing agents) minus
anything that looks like a credential: names judged by their
underscore-separated words (TOKENIZERS_PARALLELISM stays, GITHUB_TOKEN
goes), plus known credential variables whose names do not say so, and any
value that carries a password in a URL.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping

SECRET_PREFIXES = ("RESIDENT_", "OPENAI_", "ANTHROPIC_", "HF_", "HUGGING_FACE_", "HUGGINGFACE_")
SECRET_WORDS = frozenset(
    {"TOKEN", "TOKENS", "SECRET", "SECRETS", "PASSWORD", "PASSWD", "APIKEY", "CREDENTIAL",
     "CREDENTIALS", "PASSPHRASE"}
)  # fmt: skip
SECRET_PHRASES = ("API_KEY", "PRIVATE_KEY", "ACCESS_KEY", "AUTH_KEY", "SECRET_KEY")
# Credentials whose names carry none of the words above.
SECRET_NAMES = frozenset(
    {"PGPASSWORD", "MYSQL_PWD", "DATABASE_URL", "GH_PAT", "SENTRY_DSN", "DOCKER_AUTH_CONFIG",
     "REDIS_URL", "MONGODB_URI", "MONGO_URL", "AMQP_URL", "CELERY_BROKER_URL", "NETRC",
     "KUBECONFIG", "VAULT_ADDR"}
)  # fmt: skip
SECRET_WORDS_EXTRA = frozenset({"PAT", "DSN", "AUTH", "COOKIE", "SIGNATURE"})
# scheme://user:password@host in any value (proxy URLs, database URLs).
_URL_WITH_PASSWORD = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/@\s:]*:[^/@\s]*@")

# What a shell command may see of the agent's environment, by name.
ALLOWED_NAMES = frozenset(
    {"PATH", "LANG", "LANGUAGE", "TERM", "COLORTERM", "NO_COLOR", "TZ", "USER", "LOGNAME",
     "SHELL",
     # Where toolchains live when not in their default place under HOME.
     "PYENV_ROOT", "PYENV_VERSION", "VIRTUAL_ENV", "CONDA_PREFIX", "CARGO_HOME",
     "RUSTUP_HOME", "RUSTUP_TOOLCHAIN", "GOROOT", "GOPATH", "JAVA_HOME", "NVM_DIR",
     "NODE_PATH"}
)  # fmt: skip

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
    if upper.startswith(SECRET_PREFIXES) or upper in SECRET_NAMES:
        return True
    if any(phrase in upper for phrase in SECRET_PHRASES) or upper.endswith("_KEY"):
        return True
    words = upper.split("_")
    return any(word in SECRET_WORDS or word in SECRET_WORDS_EXTRA for word in words)


def has_secret_value(value: str) -> bool:
    """A URL with a password in it (http://user:pass@proxy, postgres://u:p@db)."""
    return bool(_URL_WITH_PASSWORD.search(value))


def scrubbed_environment(
    base: Mapping[str, str], extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """`base` without secret-looking variables, with non-interactive defaults and `extra`."""
    env = {
        name: value
        for name, value in base.items()
        if not is_secret_variable(name) and not has_secret_value(value)
    }
    env.update(NON_INTERACTIVE)
    if extra:
        env.update(extra)
    return env


def command_environment(
    base: Mapping[str, str],
    *,
    home: str | None = None,
    tmpdir: str | None = None,
    extra_names: Iterable[str] = (),
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of a shell command: allow-listed names (and the user's
    `extra_names`) from `base`, HOME and TMPDIR as given, non-interactive defaults,
    then `extra`. A value carrying a password in a URL is dropped even when named."""
    wanted = ALLOWED_NAMES | frozenset(extra_names)
    env = {
        name: value
        for name, value in base.items()
        if (name in wanted or name.startswith("LC_")) and not has_secret_value(value)
    }
    env.setdefault("PATH", os.defpath)
    if home is not None:
        env["HOME"] = home
    if tmpdir is not None:
        env["TMPDIR"] = tmpdir
    env.update(NON_INTERACTIVE)
    if extra:
        env.update(extra)
    return env
