"""Custom slash commands from files: parsing, expansion, discovery, shadowing, hostile files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.core.command_template import (
    EmptyCommand,
    expand,
    parse_command_text,
    split_front_matter,
    split_words,
)
from agent.core.commands import SLASH_COMMANDS
from agent.core.custom_commands import (
    MAX_FILE_BYTES,
    CustomCommands,
    discover,
    parse_invocation,
    resolve_task,
)

REVIEW = """---
description: "Review a file: bugs first"
argument-hint: [FILE] [FOCUS]
allowed-tools: Bash(git diff:*)
---
Review $1, with a focus on $2.
Everything typed: $ARGUMENTS
"""


def folders(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(workspace, its command folder, the user's command folder), all made."""
    workspace = tmp_path / "repo"
    repository = workspace / ".resident" / "commands"
    user = tmp_path / "config" / "commands"
    repository.mkdir(parents=True)
    user.mkdir(parents=True)
    return workspace, repository, user


# -- the file's text ---------------------------------------------------------------------


def test_front_matter_gives_description_and_hint_and_other_keys_are_ignored():
    text = parse_command_text(REVIEW)
    assert text.description == "Review a file: bugs first"  # quotes taken off
    assert text.argument_hint == "[FILE] [FOCUS]"
    assert text.template == "Review $1, with a focus on $2.\nEverything typed: $ARGUMENTS"


def test_without_front_matter_the_first_line_describes_the_command_cut_to_one_line():
    text = parse_command_text("\n\n## Explain   the code\n\nExplain it simply.\n")
    assert text.description == "Explain the code"
    assert text.argument_hint == ""
    assert text.template.startswith("## Explain")
    long = parse_command_text("word " * 40)
    assert len(long.description) == 80 and long.description.endswith("…")


def test_an_unclosed_fence_is_a_rule_not_front_matter_and_an_empty_prompt_is_refused():
    assert split_front_matter("---\ndescription: x\nno end") == ({}, "---\ndescription: x\nno end")
    assert parse_command_text("---\nA rule above\n").description == "---"
    with pytest.raises(EmptyCommand):
        parse_command_text("---\ndescription: only this\n---\n\n  \n")
    with pytest.raises(EmptyCommand):
        parse_command_text("")


# -- expansion ---------------------------------------------------------------------------


def test_words_split_as_a_shell_does_with_quotes_grouping():
    assert split_words("a  'b c' \"d 'e'\" f\"g h\"") == ["a", "b c", "d 'e'", "fg h"]
    assert split_words("'' x") == ["", "x"]  # an empty quoted word is a word
    assert split_words("open 'quote runs on") == ["open", "quote runs on"]
    assert split_words("   ") == []


def test_expansion_fills_arguments_and_words_and_leaves_unknown_placeholders():
    template = "Fix $1 in $2 ($3). All: $ARGUMENTS. Costs $100; $HOME; $ARGUMENTS_X; $0."
    prompt = expand(template, '  calc.py "the add function"  ')
    assert prompt == (
        'Fix calc.py in the add function (). All: calc.py "the add function". '
        "Costs $100; $HOME; $ARGUMENTS_X; $0."
    )


def test_arguments_are_never_expanded_twice():
    assert expand("Say $1 then $ARGUMENTS", "$ARGUMENTS $2") == "Say $ARGUMENTS then $ARGUMENTS $2"


def test_a_template_without_placeholders_still_gets_what_was_typed():
    assert expand("Explain the code.", "") == "Explain the code."
    assert expand("Explain the code.", " calc.py ") == "Explain the code.\n\nArguments: calc.py"


def test_invocations_parse_name_and_arguments_over_lines():
    assert parse_invocation("/Review calc.py\nand tests") == ("review", "calc.py\nand tests")
    assert parse_invocation("  /fix  ") == ("fix", "")
    assert parse_invocation("/") is None
    assert parse_invocation("not a command") is None


# -- discovery -----------------------------------------------------------------------------


def test_both_folders_are_read_and_the_repositorys_command_wins(tmp_path):
    workspace, repository, user = folders(tmp_path)
    (repository / "review.md").write_text(REVIEW)
    (user / "review.md").write_text("The user's own review.\n")
    (user / "standup.md").write_text("Summarize yesterday's commits.\n")
    (repository / "notes").mkdir()
    (repository / "notes" / "deep.md").write_text("Subfolders are not read.\n")
    (repository / ".#review.md").write_text("an editor's lock file\n")
    (repository / "README.txt").write_text("not a command\n")
    found = discover(workspace, user)
    assert [(c.name, c.origin) for c in found.commands] == [
        ("review", "repository"),
        ("standup", "user"),
    ]
    assert found.problems == ()
    review = found.find("/REVIEW")
    assert review is not None and review.path == repository / "review.md"
    assert review.takes_arguments and review.slash_name == "/review"


def test_the_user_folder_defaults_to_the_config_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("RESIDENT_CONFIG_DIR", str(tmp_path / "config"))
    workspace, _, user = folders(tmp_path)
    (user / "mine.md").write_text("Mine.\n")
    assert [c.name for c in discover(workspace).commands] == ["mine"]
    assert discover(tmp_path / "no-such-repo").commands[0].name == "mine"  # no folder: fine


def test_names_must_be_lowercase_letters_digits_dash_and_underscore(tmp_path):
    workspace, repository, user = folders(tmp_path)
    for name in ("ok-1_b", "Review", "two words", "dot.name", "-dash"):
        (repository / f"{name}.md").write_text("Do it.\n")
    found = discover(workspace, user)
    assert [c.name for c in found.commands] == ["ok-1_b"]
    assert len(found.problems) == 4
    assert all("is not a command" in p and "lowercase" in p for p in found.problems)
    assert any(p.startswith(".resident/commands/Review.md ") for p in found.problems)


@pytest.mark.parametrize("name", [c.name[1:] for c in SLASH_COMMANDS] + ["exit"])
def test_a_file_named_like_a_builtin_is_refused_and_the_builtin_stays(tmp_path, name):
    workspace, repository, user = folders(tmp_path)
    (repository / f"{name}.md").write_text("Take over.\n")
    (user / f"{name}.md").write_text("Take over too.\n")
    found = discover(workspace, user)
    assert found.commands == ()
    assert len(found.problems) == 2
    repository_problem = found.problems[1]
    assert repository_problem.startswith(f".resident/commands/{name}.md is not used: /{name}")
    assert "built-in" in repository_problem and str(user / f"{name}.md") in found.problems[0]


def test_files_are_read_afresh_and_each_problem_is_told_once(tmp_path):
    workspace, repository, user = folders(tmp_path)
    commands = CustomCommands(workspace, user)
    assert commands.commands() == ()
    (repository / "later.md").write_text("Added during the session.\n")
    (repository / "model.md").write_text("Shadows /model.\n")
    assert [c.name for c in commands.commands()] == ["later"]
    first = commands.new_problems()
    assert len(first) == 1 and "model.md" in first[0]
    assert commands.new_problems() == []  # told already
    (repository / "later.md").write_text("Changed.\n")
    assert commands.commands()[0].template == "Changed."
    (repository / "later.md").unlink()
    assert commands.commands() == ()


def test_an_invocation_keeps_what_was_typed_and_the_expansion(tmp_path):
    workspace, repository, user = folders(tmp_path)
    (repository / "review.md").write_text(REVIEW)
    commands = CustomCommands(workspace, user)
    invocation = commands.invocation("/review calc.py 'the add function'")
    assert invocation is not None
    assert invocation.typed == "/review calc.py 'the add function'"
    assert invocation.prompt == (
        "Review calc.py, with a focus on the add function.\n"
        "Everything typed: calc.py 'the add function'"
    )
    assert resolve_task("/review x", commands) == (
        "Review x, with a focus on .\nEverything typed: x",
        "/review x",
    )
    # Not a custom command: the line is the task as it is.
    assert resolve_task("/help", commands) == ("/help", None)
    assert resolve_task("/tmp/log has errors", commands) == ("/tmp/log has errors", None)
    assert resolve_task("fix add", commands) == ("fix add", None)


# -- hostile files -------------------------------------------------------------------------


def test_a_huge_file_is_refused_without_being_read_whole(tmp_path):
    workspace, repository, user = folders(tmp_path)
    with (repository / "huge.md").open("wb") as huge:
        huge.write(b"Do this. " * (10 * 1024 * 1024 // 9))
    (repository / "edge.md").write_bytes(b"x" * MAX_FILE_BYTES)  # exactly the limit: fine
    found = discover(workspace, user)
    assert [c.name for c in found.commands] == ["edge"]
    (problem,) = found.problems
    assert problem.startswith(".resident/commands/huge.md is not used: it is 10,")
    assert f"at most {MAX_FILE_BYTES:,}" in problem


def test_binary_and_non_utf8_files_are_refused_with_the_reason(tmp_path):
    workspace, repository, user = folders(tmp_path)
    (repository / "binary.md").write_bytes(b"\x7fELF\x02\x01\x00\x00rest")
    (repository / "latin1.md").write_bytes("Résumé".encode("latin-1"))
    (repository / "bom.md").write_bytes("\ufeffWith a byte order mark.\n".encode())
    (repository / "bom-bad.md").write_bytes("\ufeffab".encode() + b"\xff")  # offset in the file
    found = discover(workspace, user)
    assert [(c.name, c.template) for c in found.commands] == [("bom", "With a byte order mark.")]
    assert found.problems == (
        ".resident/commands/binary.md is not used: it is binary (it has NUL bytes), not text.",
        ".resident/commands/bom-bad.md is not used: it is not UTF-8 text (byte 0xff at offset 5).",
        ".resident/commands/latin1.md is not used: it is not UTF-8 text (byte 0xe9 at offset 1).",
    )


def test_a_repository_link_must_stay_inside_the_repository(tmp_path):
    workspace, repository, user = folders(tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_text("id_rsa contents\n")
    (repository / "secret.md").symlink_to(secret)
    (repository / "passwd.md").symlink_to("/etc/passwd")
    (workspace / "prompts").mkdir()
    (workspace / "prompts" / "shared.md").write_text("A prompt kept elsewhere in the repo.\n")
    (repository / "shared.md").symlink_to(workspace / "prompts" / "shared.md")
    (repository / "dangling.md").symlink_to(workspace / "missing.md")
    found = discover(workspace, user)
    assert [c.name for c in found.commands] == ["shared"]
    problems = "\n".join(found.problems)
    assert f"secret.md is not used: it is a link to {secret}, outside the repository" in problems
    assert "passwd.md is not used: it is a link to /etc/passwd, outside the repository" in problems
    assert "dangling.md is not used: it cannot be read" in problems
    assert all("id_rsa" not in c.template for c in found.commands)


def test_a_linked_commands_folder_outside_the_repository_is_refused_too(tmp_path):
    workspace = tmp_path / "repo"
    workspace.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "leak.md").write_text("Outside.\n")
    # .resident is a link out of the repository, and its commands/ leads on to elsewhere/.
    (workspace / ".resident").symlink_to(tmp_path)
    (tmp_path / "commands").symlink_to(elsewhere)
    found = discover(workspace, tmp_path / "no-user-folder")
    assert found.commands == ()
    assert "leak.md is not used: it is a link to" in found.problems[0]


def test_links_in_the_users_own_folder_are_followed(tmp_path):
    workspace, _, user = folders(tmp_path)
    dotfiles = tmp_path / "dotfiles" / "standup.md"
    dotfiles.parent.mkdir()
    dotfiles.write_text("Summarize yesterday.\n")
    (user / "standup.md").symlink_to(dotfiles)
    found = discover(workspace, user)
    assert [c.name for c in found.commands] == ["standup"] and found.problems == ()


def test_a_fifo_or_a_folder_named_md_is_refused_without_waiting(tmp_path):
    workspace, repository, user = folders(tmp_path)
    os.mkfifo(repository / "pipe.md")
    (repository / "folder.md").mkdir()
    found = discover(workspace, user)  # a blocking open of the FIFO would hang here
    assert found.commands == ()
    assert sorted(found.problems) == [
        ".resident/commands/folder.md is not used: it is a directory, not a regular file.",
        ".resident/commands/pipe.md is not used: it is a FIFO (named pipe), not a regular file.",
    ]


def test_an_unreadable_file_is_a_problem_not_a_crash(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root reads any file")
    workspace, repository, user = folders(tmp_path)
    locked = repository / "locked.md"
    locked.write_text("Secret.\n")
    locked.chmod(0)
    try:
        found = discover(workspace, user)
    finally:
        locked.chmod(0o644)
    assert found.commands == ()
    assert found.problems[0].startswith(".resident/commands/locked.md is not used: it cannot")
