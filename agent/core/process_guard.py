"""Guarding the agent process itself from the commands it runs.

Two things a command could otherwise read about the agent: its memory (a
same-user process may ptrace it or read /proc/PID/mem) and its environment
(API keys for the engine or an attached server). The process is made
non-dumpable, which also makes its /proc files owned by root; and secret
variables leave `os.environ` once the CLI has read its options, so no child
inherits them by accident. (The kernel still shows the environment the
process was started with in /proc/PID/environ; non-dumpable is what keeps
other processes of the same user out of it. Inside the sandbox the agent is
not visible at all: commands have their own PID namespace.)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

from tools.process.environment import is_secret_variable

_PR_SET_DUMPABLE = 4
# Variables that configure the agent, or name an agent socket the user's own git
# signing needs (a commit signed outside the sandbox), rather than hold secrets.
# Every RESIDENT_ variable the agent or its in-process engine reads after start-up
# belongs here: the RESIDENT_ prefix alone counts as secret, and a setting dropped
# here is silently ignored (RESIDENT_CACHE_DIR: the local engine's KV disk tier).
CONFIG_NAMES = frozenset(
    {"RESIDENT_DATA_DIR", "RESIDENT_CONFIG_DIR", "RESIDENT_CACHE_DIR", "RESIDENT_NO_SANDBOX",
     "RESIDENT_CPU_KERNELS", "RESIDENT_CPU_ISA", "SSH_AUTH_SOCK", "GPG_AGENT_INFO"}
)  # fmt: skip


def make_undumpable() -> bool:
    """prctl(PR_SET_DUMPABLE, 0); False where the OS has no such call."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


# What left the environment, kept in this process only for what the user's own config
# names explicitly (`${GITHUB_TOKEN}` in their MCP servers file): no child inherits it.
_withheld: dict[str, str] = {}


def drop_secret_variables() -> list[str]:
    """Remove credential-looking variables from this process's environment; their
    names, sorted. Call after the options that read them (--api-key) are parsed."""
    dropped = sorted(
        name for name in os.environ if is_secret_variable(name) and name not in CONFIG_NAMES
    )
    for name in dropped:
        value = os.environ.pop(name, None)
        if value is not None:
            _withheld[name] = value
    return dropped


def withheld_variable(name: str) -> str | None:
    """A variable `drop_secret_variables` took out of the environment, for explicit use."""
    return _withheld.get(name)


def guard_agent_process() -> None:
    make_undumpable()
    drop_secret_variables()
