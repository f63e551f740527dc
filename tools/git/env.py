"""The environment every git process of the project runs with: config forced, repository pinned.

A repository's own config can run programs (core.fsmonitor, core.sshCommand,
hooks, pagers, diff and filter drivers), and git searches upwards for a
repository, so a folder shaped like a bare repository inside the workspace
becomes "the repository" for whoever runs git there. Forcing config through
GIT_CONFIG_COUNT (it outranks every config file) and pinning GIT_DIR and
GIT_WORK_TREE closes both doors, for the tools, the checkpoints, the
snapshot's file list and, inside the sandbox, for the shell.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

# Run git as a tool, not as a person at a terminal.
NON_INTERACTIVE_GIT = {
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_PAGER": "cat",
    "PAGER": "cat",
    "GIT_EDITOR": "true",
    "GIT_OPTIONAL_LOCKS": "0",
    "GIT_ASKPASS": "",
    "SSH_ASKPASS": "",
}

# Config that no repository file can override (GIT_CONFIG_COUNT wins over all of them).
FORCED_CONFIG: tuple[tuple[str, str], ...] = (
    ("safe.bareRepository", "explicit"),  # an embedded bare-looking folder is not a repo
    ("core.fsmonitor", "false"),  # a program git would start on every status
    ("core.pager", "cat"),
    ("core.editor", "true"),
    ("core.sshCommand", "false"),  # and GIT_SSH_COMMAND is never passed
    ("core.askPass", ""),
    ("credential.helper", ""),  # resets the list: no credential program runs
    ("protocol.ext.allow", "never"),  # ext:: URLs run commands
    ("protocol.file.allow", "user"),
    ("sequence.editor", "true"),
    ("log.showSignature", "false"),  # verifying a signature runs gpg.program
)
# Signing runs gpg.program (or gpg.ssh/x509.program) from any config file. Off for
# everything but the commit the user approved, which signs as the user set it up.
SIGNING_OFF: tuple[tuple[str, str], ...] = (
    ("gpg.program", "false"),
    ("gpg.ssh.program", "false"),
    ("gpg.x509.program", "false"),
    ("commit.gpgSign", "false"),
    ("tag.gpgSign", "false"),
)
HOOKS_OFF = ("core.hooksPath", os.devnull)

# Variables that would redirect git to another repository, config or program.
GIT_REDIRECTING_VARIABLES = (
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_COMMON_DIR",
    "GIT_NAMESPACE",
    "GIT_CONFIG",
    "GIT_CONFIG_PARAMETERS",
    "GIT_CONFIG_COUNT",
    "GIT_EXEC_PATH",
    "GIT_SSH",
    "GIT_SSH_COMMAND",
    "GIT_PROXY_COMMAND",
    "GIT_EXTERNAL_DIFF",
    "GIT_TRACE",
    "GIT_TRACE2",
    "GIT_TRACE2_EVENT",
)


def forced_config_env(
    *,
    hooks: bool = False,
    signing: bool | None = None,
    extra: Sequence[tuple[str, str]] = (),
) -> dict[str, str]:
    """GIT_CONFIG_COUNT/KEY_n/VALUE_n entries forcing FORCED_CONFIG, and hooks and
    signing off unless `hooks`: only a commit the user approved runs the repository's
    hooks, and that commit is signed as the user configured (as `git commit` would).
    `signing` overrides the signing half; `extra` pairs are forced last."""
    pairs = list(FORCED_CONFIG)
    if not (hooks if signing is None else signing):
        pairs += SIGNING_OFF
    if not hooks:
        pairs.append(HOOKS_OFF)
    pairs += extra
    env = {"GIT_CONFIG_COUNT": str(len(pairs))}
    for index, (key, value) in enumerate(pairs):
        env[f"GIT_CONFIG_KEY_{index}"] = key
        env[f"GIT_CONFIG_VALUE_{index}"] = value
    return env


def pinned_repository_env(git_dir: Path, work_tree: Path) -> dict[str, str]:
    """GIT_DIR and GIT_WORK_TREE fixed to one repository, and no discovery above it."""
    return {
        "GIT_DIR": os.fspath(git_dir),
        "GIT_WORK_TREE": os.fspath(work_tree),
        "GIT_CEILING_DIRECTORIES": os.fspath(Path(work_tree).parent),
    }


def hardened_git_env(
    base: Mapping[str, str],
    *,
    hooks: bool = False,
    git_dir: Path | None = None,
    work_tree: Path | None = None,
) -> dict[str, str]:
    """`base` without variables that redirect git, plus forced config, non-interactive
    defaults and, when given, the pinned repository."""
    env = {name: value for name, value in base.items() if name not in GIT_REDIRECTING_VARIABLES}
    env = {
        name: value
        for name, value in env.items()
        if not name.startswith(("GIT_CONFIG_KEY_", "GIT_CONFIG_VALUE_"))
    }
    env.update(NON_INTERACTIVE_GIT)
    env.update(forced_config_env(hooks=hooks))
    if git_dir is not None and work_tree is not None:
        env.update(pinned_repository_env(git_dir, work_tree))
    return env
