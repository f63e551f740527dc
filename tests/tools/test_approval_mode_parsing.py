"""The approval mode is parsed once, by ApprovalMode.parse, where text comes in.

Every spelling a front end took before the parser was shared still parses;
a bad word gets the one error naming every mode; and every list of modes a
person or a client sees (`--approval`'s choices, `/approval`'s help and
completion, ACP's session modes) is the enum's, so a mode added to the enum
shows up everywhere or these tests fail.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from tools import ApprovalMode, PermissionPolicy

# The ids clients and scripts already use: they may gain company, never change.
PUBLISHED_IDS = ("read-only", "ask", "auto-edit", "full-auto")


def spellings(mode: ApprovalMode) -> list[str]:
    """What people typed for `mode` and had accepted: the id (`--approval`, ACP),
    any case with spaces around it (`/approval`), and the member's name."""
    return [
        mode.value,
        mode.value.upper(),
        f"  {mode.value.title()}\n",
        mode.name,  # READ_ONLY: `_` for `-`
        mode.name.lower(),
    ]


def test_the_published_ids_are_still_the_modes():
    assert set(PUBLISHED_IDS) <= set(ApprovalMode.ids())
    assert ApprovalMode.ids() == tuple(mode.value for mode in ApprovalMode)


@pytest.mark.parametrize("mode", list(ApprovalMode), ids=ApprovalMode.ids())
def test_every_accepted_spelling_parses(mode):
    for text in spellings(mode):
        assert ApprovalMode.parse(text) is mode, text
    assert ApprovalMode.parse(mode) is mode


@pytest.mark.parametrize("text", ["sometimes", "", "  ", "full auto", "fullauto", "yolo", "ask!"])
def test_a_bad_word_gets_the_one_error_naming_every_mode(text):
    with pytest.raises(ValueError) as raised:
        ApprovalMode.parse(text)
    message = str(raised.value)
    assert message.startswith(f"unknown approval mode {text!r}")
    assert message.endswith("the modes are " + ", ".join(ApprovalMode.ids()))


def test_the_policy_takes_a_mode_never_text(workspace):
    """Modes are compared by identity inside: a string would loosen read-only."""
    with pytest.raises(TypeError):
        PermissionPolicy("read-only", workspace=workspace)  # type: ignore[arg-type]
    policy = PermissionPolicy(ApprovalMode.READ_ONLY, workspace=workspace)
    with pytest.raises(TypeError):
        policy.mode = "full-auto"  # type: ignore[assignment]
    assert policy.mode is ApprovalMode.READ_ONLY


# -- the CLI ------------------------------------------------------------------------


def test_the_cli_offers_the_enums_modes_and_parses_them():
    from agent.cli import app

    runner = CliRunner()
    choices = "<" + "|".join(ApprovalMode.ids()) + ">"
    for command in ([], ["run"], ["acp"]):
        shown = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "200"})
        assert shown.exit_code == 0 and choices in shown.output, (command, shown.output)
        bad = runner.invoke(app, [*command, "--approval", "sometimes"], env={"COLUMNS": "200"})
        assert bad.exit_code == 2, (command, bad.output)
        assert "unknown approval mode 'sometimes'" in bad.output
        assert all(mode in bad.output for mode in ApprovalMode.ids())
    # Any accepted spelling gets past the option: the next check (a URL given as
    # --model, also exit 2) is what stops the run, with its own message.
    typed = runner.invoke(app, ["run", "hi", "--approval", " Full_Auto", "-m", "http://x"])
    assert typed.exit_code == 2 and "--attach URL" in typed.output, typed.output


# -- /approval ------------------------------------------------------------------------


def test_the_approval_commands_choices_are_the_enums():
    from agent.core.commands import APPROVAL_MODES
    from agent.tui.completion import complete

    assert APPROVAL_MODES == ApprovalMode.ids()
    offered = complete("/approval ", first_line=True, files=[])
    assert offered is not None and [i.insert for i in offered.items] == list(ApprovalMode.ids())


def _slash_commands(chosen: list):
    """SlashCommands over a host that records notes and the bridge's mode changes."""
    from agent.tui.slash import SlashCommands

    notes: list[tuple[str, str]] = []

    async def note(text: str, kind: str = "") -> None:
        notes.append((text, kind))

    def set_approval(mode):
        chosen.append(mode)
        return mode

    bridge = SimpleNamespace(set_approval=set_approval, approval_mode=lambda: ApprovalMode.ASK)
    host = SimpleNamespace(
        bridge=bridge,
        conversation=SimpleNamespace(note=note),
        status=SimpleNamespace(set_approval=lambda mode: None),
    )
    return SlashCommands(host), notes  # type: ignore[arg-type]


def test_the_approval_command_hands_on_a_mode_and_names_them_when_asked():
    chosen: list = []
    commands, notes = _slash_commands(chosen)
    asyncio.run(commands.do_approval("Auto_Edit"))
    assert chosen == [ApprovalMode.AUTO_EDIT] and type(chosen[0]) is ApprovalMode
    asyncio.run(commands.do_approval("sometimes"))
    assert chosen == [ApprovalMode.AUTO_EDIT]  # nothing changed
    assert notes[-1][0].startswith("unknown approval mode 'sometimes'")
    asyncio.run(commands.do_approval(""))
    assert ", ".join(ApprovalMode.ids()) in notes[-1][0]


# -- ACP ----------------------------------------------------------------------------------


def test_acps_session_modes_are_the_enums():
    from agent.acp.server import MODES

    assert tuple(m.id for m in MODES) == ApprovalMode.ids()
    for session_mode, mode in zip(MODES, ApprovalMode, strict=True):
        assert (session_mode.name, session_mode.description) == (mode.label, mode.description)
        assert session_mode.name and session_mode.description
