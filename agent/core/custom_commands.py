"""Custom slash commands: Markdown files that become `/NAME`, as in Claude Code and others.

`.resident/commands/NAME.md` in the repository and `commands/NAME.md` in the
user's config directory (RESIDENT_CONFIG_DIR, else the platform's) each give
`/NAME`; the repository's replaces the user's of the same name. Only the
folders' own `*.md` files count (no subfolders, no hidden files); a name is
lowercase letters, digits, `-` and `_`. What a file holds and how it expands:
agent/core/command_template.py.

The folders are read again whenever the list is wanted, so a file added
during a session is there at the next completion. Each file is read with
care, since a repository is not the user's own text: at most 64 KiB, a
regular file, UTF-8 without NUL bytes; a symbolic link in the repository must
lead to a file inside the repository (a link to ~/.ssh/id_rsa would otherwise
send the key to the model, and with --attach to another machine), while links
in the user's own folder are followed wherever they lead, as the user made
them. A file that cannot be used is a *problem*, a sentence naming the file,
and is skipped; so is one whose name is a built-in command's, which keeps
working. Front ends show each problem once (`CustomCommands.new_problems`).
"""

from __future__ import annotations

import codecs
import os
import re
from dataclasses import dataclass
from pathlib import Path

from agent.core.command_template import EmptyCommand, expand, parse_command_text, takes_arguments
from agent.core.commands import find_command
from agent.core.mcp.config import user_config_dir
from tools.workspace.bounded_read import RefusedFile, read_bounded

REPOSITORY_COMMANDS = Path(".resident") / "commands"
USER_COMMANDS = "commands"  # under the user's config directory
MAX_FILE_BYTES = 64 * 1024
NAME = re.compile(r"[a-z0-9][a-z0-9_-]*")
# `/NAME`, then anything (more lines too) after whitespace.
INVOCATION = re.compile(r"/(\S+)(?:\s+(.*))?", re.DOTALL)


@dataclass(frozen=True)
class CustomCommand:
    name: str  # without the slash
    description: str
    argument_hint: str
    template: str
    path: Path  # the file, as found in its folder
    origin: str  # "repository" or "user"

    @property
    def slash_name(self) -> str:
        return "/" + self.name

    @property
    def takes_arguments(self) -> bool:
        return bool(self.argument_hint) or takes_arguments(self.template)

    def expand(self, arguments: str) -> str:
        return expand(self.template, arguments)


@dataclass(frozen=True)
class Invocation:
    """`/NAME arguments` as typed, and the prompt the model gets for it."""

    command: CustomCommand
    typed: str  # what the user typed, shown as the user's message
    prompt: str  # the expansion, what the conversation keeps


@dataclass(frozen=True)
class Discovery:
    commands: tuple[CustomCommand, ...]  # by name
    problems: tuple[str, ...]

    def find(self, name: str) -> CustomCommand | None:
        name = name.lower().removeprefix("/")
        return next((c for c in self.commands if c.name == name), None)


class UnusableFile(Exception):
    """Why a command file was skipped (the end of a sentence that names the file)."""


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def read_command_file(path: Path, confine_to: Path | None) -> str:
    """The file's text. Raises UnusableFile. `confine_to`: the folder its real path must
    lie in (symbolic links resolved); None follows links anywhere."""
    opened = str(path)
    if confine_to is not None:
        opened = os.path.realpath(path)  # and open that, not the link checked a moment ago
        if not _inside(opened, os.path.realpath(confine_to)):
            raise UnusableFile(f"is a link to {opened}, outside the repository")
    try:
        data = read_bounded(opened, MAX_FILE_BYTES)
    except RefusedFile as err:  # a FIFO, device or directory, or over the cap
        raise UnusableFile(err.reason) from None
    except OSError as err:
        raise UnusableFile(f"cannot be read ({err.strerror or err})") from None
    if b"\x00" in data:
        raise UnusableFile("is binary (it has NUL bytes), not text")
    text = data.removeprefix(codecs.BOM_UTF8)  # a byte order mark is no part of the prompt
    try:
        return text.decode("utf-8")
    except UnicodeDecodeError as err:
        offset = err.start + len(data) - len(text)
        raise UnusableFile(
            f"is not UTF-8 text (byte {text[err.start]:#04x} at offset {offset})"
        ) from None


def _shown(path: Path, workspace: Path) -> str:
    try:
        return path.relative_to(workspace).as_posix()
    except ValueError:
        return str(path)


def _command_files(folder: Path) -> list[Path]:
    """The folder's own `*.md` files, by name; hidden ones (editors' lock and backup
    files among them) left out. No folder: none."""
    try:
        names = sorted(os.listdir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [folder / n for n in names if n.endswith(".md") and not n.startswith(".")]


def _load_folder(
    folder: Path, origin: str, workspace: Path, confine_to: Path | None
) -> tuple[list[CustomCommand], list[str]]:
    commands: list[CustomCommand] = []
    problems: list[str] = []
    try:
        files = _command_files(folder)
    except OSError as err:
        return [], [f"{_shown(folder, workspace)} cannot be listed ({err.strerror or err})."]
    for path in files:
        shown = _shown(path, workspace)
        name = path.name[: -len(".md")]
        if NAME.fullmatch(name) is None:
            problems.append(
                f"{shown} is not a command: a command's name is lowercase letters, "
                "digits, - and _ (rename the file)."
            )
            continue
        builtin = find_command("/" + name)
        if builtin is not None:
            problems.append(
                f"{shown} is not used: /{name} is a built-in command ({builtin.help}); "
                "rename the file to make it a command of its own."
            )
            continue
        try:
            text = parse_command_text(read_command_file(path, confine_to))
        except (UnusableFile, EmptyCommand) as err:
            problems.append(f"{shown} is not used: it {err}.")
            continue
        commands.append(
            CustomCommand(name, text.description, text.argument_hint, text.template, path, origin)
        )
    return commands, problems


def discover(workspace: Path, user_folder: Path | None = None) -> Discovery:
    """The custom commands for `workspace`, read now. `user_folder`: the user's command
    folder (default: `commands` in the user's config directory)."""
    workspace = Path(os.path.realpath(workspace))
    user_folder = user_folder if user_folder is not None else user_config_dir() / USER_COMMANDS
    user, user_problems = _load_folder(user_folder, "user", workspace, None)
    repository, repository_problems = _load_folder(
        workspace / REPOSITORY_COMMANDS, "repository", workspace, workspace
    )
    by_name = {c.name: c for c in user}
    by_name.update({c.name: c for c in repository})  # the repository's wins
    commands = tuple(by_name[name] for name in sorted(by_name))
    return Discovery(commands, tuple(user_problems + repository_problems))


def parse_invocation(line: str) -> tuple[str, str] | None:
    """(name, arguments) of `/NAME arguments`; None when the line is no such thing."""
    match = INVOCATION.fullmatch(line.strip())
    if match is None:
        return None
    return match.group(1).lower(), (match.group(2) or "").strip()


class CustomCommands:
    """One session's custom commands: read afresh each time, each problem told once."""

    def __init__(self, workspace: Path, user_folder: Path | None = None) -> None:
        self.workspace = workspace
        self.user_folder = user_folder
        self._told: set[str] = set()

    def discover(self) -> Discovery:
        return discover(self.workspace, self.user_folder)

    def commands(self) -> tuple[CustomCommand, ...]:
        return self.discover().commands

    def new_problems(self, discovery: Discovery | None = None) -> list[str]:
        """Problems not told before (the folders are read again unless `discovery` is
        given); each is counted as told from now on."""
        found = (discovery or self.discover()).problems
        fresh = [p for p in found if p not in self._told]
        self._told.update(fresh)
        return fresh

    def invocation(self, line: str, discovery: Discovery | None = None) -> Invocation | None:
        """`line` as a custom command's prompt; None when it names none (a built-in,
        an unknown name, or no command at all). `discovery`: the commands as just read
        (else the folders are read now)."""
        parsed = parse_invocation(line)
        if parsed is None:
            return None
        name, arguments = parsed
        command = (discovery or self.discover()).find(name)
        if command is None:
            return None
        return Invocation(command, line.strip(), command.expand(arguments))


def resolve_task(line: str, commands: CustomCommands) -> tuple[str, str | None]:
    """(what the model gets, what the user's message shows) for a line sent as a task:
    a custom command's expansion shown as typed, or the line itself (None: as it is)."""
    invocation = commands.invocation(line)
    if invocation is None:
        return line, None
    return invocation.prompt, invocation.typed
