"""Every agent setting is declared once, in AgentConfig (issue #39): `resident`, `resident
run` and `resident acp` take their options from it and build RuntimeOptions in one place;
the default model's name is written once, by the engine; the engine settings the agent's
own engine uses unlike `resident serve` are listed in one place, with why, and shown
(/v1/engine/stats, the TUI's and the REPL's /settings)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import typer
from fastapi.testclient import TestClient
from typer._click import Context
from typer.testing import CliRunner

import agent.cli as cli
from agent.cli.options import COMMAND_SETTINGS, ENVVARS, command_settings, flags_of
from agent.core.clients import EngineFailure, local
from agent.core.clients.engine_profile import (
    LOCAL_DEFAULT_MODEL,
    LOCAL_ENGINE_CHOICES,
    compare_with_serve,
    local_engine_settings,
    unexplained_serve_differences,
)
from agent.core.commands import APPROVAL_MODES, SLASH_COMMANDS
from agent.core.config import DEFAULTS, AgentConfig, default_setting, setting_help
from agent.core.loop import AgentSettings
from agent.core.runtime import RuntimeOptions
from agent.tui.slash import SlashCommands
from engine.config import EngineConfig
from engine.errors import EngineError
from engine.model_files.store import DEFAULT_MODEL_NAME
from engine.server.app import create_app
from engine.server.options import SERVE_DEFAULTS
from engine.server.served_model import ServedModel
from tests.agent.scripted_server import ScriptedServer
from tools import ApprovalMode

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()
COMMANDS = ("main", "run", "acp")


def _click_commands() -> dict[str, Any]:
    """The click commands typer builds (typer carries its own click)."""
    group: Any = typer.main.get_command(cli.app)
    return {"main": group, "run": group.commands["run"], "acp": group.commands["acp"]}


def _options(command: Any) -> dict[str, Any]:
    params = command.params
    return {p.name: p for p in params if p.param_type_name == "option" and p.name != "help"}


def _declared_default(name: str) -> Any:
    default = default_setting(name)
    return list(default) if isinstance(default, tuple) else default


# -- the commands' options -----------------------------------------------------------------


def test_every_option_of_main_run_and_acp_is_a_declared_setting():
    for command, clicked in _click_commands().items():
        options = _options(clicked)
        assert list(options) == command_settings(command), command  # all, in declared order
        for name, option in options.items():
            assert name in AgentConfig.model_fields, (command, name)
            assert option.default == _declared_default(name), (command, name)
            assert option.help == setting_help(name), (command, name)
            assert tuple(option.opts) == flags_of(name), (command, name)
            assert option.envvar == ENVVARS.get(name), (command, name)
    assert set().union(*COMMAND_SETTINGS.values()) == set(AgentConfig.model_fields)


def test_the_three_commands_share_spelling_default_and_help():
    commands = {name: (c, _options(c)) for name, c in _click_commands().items()}
    shared = [n for n in AgentConfig.model_fields if sum(n in o for _, o in commands.values()) > 1]
    assert {"model", "attach", "api_key", "approval", "network", "sandbox_read"} <= set(shared)
    for name in shared:
        seen = [
            (o.opts, o.secondary_opts, o.default, o.envvar, o.is_flag, o.multiple)
            + (o.min, o.max, o.get_help_record(Context(command)))  # help line: metavar, help
            for command, options in commands.values()
            if (o := options.get(name)) is not None
        ]
        assert all(facts == seen[0] for facts in seen), name


def test_the_flags_people_use_are_still_there():
    """The flags each command had before its options were derived from AgentConfig."""
    common = {"--model", "-m", "--attach", "--api-key", "--context-window", "--approval"}
    common |= {"--network", "--sandbox-env", "--sandbox-read"}
    expected = {
        "main": common | {"--resume", "--continue", "--plain", "--verbose", "-v"},
        "run": common
        | {"--json", "--max-turns", "--max-tokens", "--resume", "--continue"}
        | {"--allow", "--deny", "--tools"},
        "acp": common | {"--max-turns", "--max-tokens", "--allow", "--deny", "--tools"},
    }
    for command, clicked in _click_commands().items():
        flags = {flag for option in _options(clicked).values() for flag in option.opts}
        assert flags == expected[command], command


def _parameters_written(function_name: str) -> list[str]:
    """The parameters `agent/cli/__init__.py` writes for a command function."""
    tree = ast.parse((ROOT / "agent/cli/__init__.py").read_text())
    function = next(
        n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function_name
    )
    return [a.arg for a in function.args.args + function.args.kwonlyargs]


def test_the_commands_write_no_option_and_build_runtime_options_in_one_place():
    assert _parameters_written("main") == ["ctx"]
    assert _parameters_written("run") == ["task"]
    assert _parameters_written("acp") == []
    for path in (ROOT / "agent").rglob("*.py"):
        text = path.read_text()
        if path.name != "runtime.py":
            assert "RuntimeOptions(" not in text, path.relative_to(ROOT)


def test_runtime_options_take_the_declared_defaults_and_round_trip():
    config = AgentConfig(
        model="m",
        attach="http://x",
        api_key="k",
        context_window=4096,
        approval=ApprovalMode.AUTO_EDIT,
        max_turns=3,
        max_tokens=20,
        resume="abc",
        allow=("shell:pytest",),
        deny=("shell:git push",),
        tools="read, grep",
        network=True,
        sandbox_env=("HOME",),
        sandbox_read=(Path("/opt"),),
    )
    options = RuntimeOptions.from_config(config)
    assert options.tools == ("read", "grep") and options.settings.max_turns == 3
    assert options.as_config() == config.model_copy(update={"tools": "read,grep"})
    assert RuntimeOptions().as_config() == DEFAULTS
    assert AgentSettings() == RuntimeOptions.from_config(DEFAULTS).settings
    assert APPROVAL_MODES == ApprovalMode.ids()  # /approval's choices are the declared ones


@pytest.fixture
def started(monkeypatch) -> list[Any]:
    """What the front ends are started with: (front end, RuntimeOptions)."""
    seen: list[Any] = []
    monkeypatch.setattr(cli, "guard_agent_process", lambda: None)
    monkeypatch.setattr(cli, "_on_terminal", lambda: False)
    import agent.acp
    import agent.headless
    import agent.repl

    monkeypatch.setattr(agent.repl, "run_repl", lambda o: seen.append(("repl", o)) or 0)
    monkeypatch.setattr(agent.acp, "run_acp", lambda o: seen.append(("acp", o)) or 0)
    monkeypatch.setattr(
        agent.headless, "run_headless", lambda h: seen.append(("run", h.runtime, h.json)) or 0
    )
    return seen


def test_each_command_hands_its_settings_to_the_runtime(started):
    shared = ["-m", "some-model", "--approval", "Full_Auto", "--network", "--sandbox-env", "A"]
    shared += ["--sandbox-env", "B", "--sandbox-read", "/opt"]
    for args in (
        shared,
        ["run", "a task", "--json", "--max-turns", "7", "--tools", "read,grep", *shared],
        ["acp", "--allow", "shell:ls", "--max-tokens", "9", *shared],
    ):
        result = runner.invoke(cli.app, args)
        assert result.exit_code == 0, result.output
    (_, main), (_, run, as_json), (_, acp) = started
    for options in (main, run, acp):
        assert options.model == "some-model" and options.approval is ApprovalMode.FULL_AUTO
        assert options.network and options.sandbox_env == ("A", "B")
        assert options.sandbox_read == (Path("/opt"),)
    assert as_json and run.settings.max_turns == 7 and run.tools == ("read", "grep")
    assert acp.allow == ("shell:ls",) and acp.settings.max_tokens == 9
    assert main.settings == AgentSettings() and main.tools is None


def test_usage_errors_are_the_same_for_every_command(started):
    for command in ([], ["run", "task"], ["acp"]):
        result = runner.invoke(cli.app, [*command, "--model", "http://host/v1"])
        assert result.exit_code == 2 and "use --attach URL" in result.output, command
        result = runner.invoke(cli.app, [*command, "--approval", "sometimes"])
        assert result.exit_code == 2 and "unknown approval mode" in result.output, command
    assert not started


# -- the default model ------------------------------------------------------------------------


def test_the_default_model_name_is_written_once():
    written = []
    for package in ("agent", "engine", "tools", "prompts"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and node.value == DEFAULT_MODEL_NAME:
                    written.append(str(path.relative_to(ROOT)))
    assert written == ["engine/model_files/store.py"]
    assert LOCAL_DEFAULT_MODEL == DEFAULT_MODEL_NAME


def test_a_local_client_without_a_model_starts_the_engines_default(monkeypatch):
    asked = []

    def start_engine(model: str, **config: Any) -> Any:
        asked.append(model)
        raise EngineError("not pulled")

    monkeypatch.setattr(local, "start_engine", start_engine)
    with pytest.raises(EngineFailure):
        local.LocalClient.start(None)
    assert asked == [DEFAULT_MODEL_NAME]


# -- the agent's engine beside `resident serve` -------------------------------------------


def test_every_difference_from_serve_is_listed_with_why():
    assert unexplained_serve_differences() == []
    names = [choice.setting for choice in LOCAL_ENGINE_CHOICES]
    assert len(names) == len(set(names)) and set(names) <= set(EngineConfig.model_fields)
    assert all(choice.why for choice in LOCAL_ENGINE_CHOICES)
    rows = {row.setting: row for row in compare_with_serve()}
    speculative = rows["speculative"]
    assert (speculative.agent, speculative.serve) == ("prompt_lookup", "none")
    for name, row in rows.items():
        assert row.serve == SERVE_DEFAULTS.get(name, EngineConfig.model_fields[name].default)


def test_the_local_engine_starts_with_the_listed_settings(monkeypatch):
    import engine.async_engine

    configs: list[EngineConfig] = []
    monkeypatch.setattr(engine.async_engine, "AsyncEngine", configs.append)
    local.start_engine("some-model")
    local.start_engine("some-model", speculative="none")  # a given setting still wins
    for name, value in local_engine_settings().items():
        assert getattr(configs[0], name) == value, name
    assert configs[1].speculative == "none"
    assert "setdefault" not in inspect.getsource(local.start_engine)


class _StatsEngine:
    async def stats(self) -> dict:
        return {"kv_cache_dtype": "fp8_e4m3", "capacity_tokens": 1024}


def test_engine_stats_show_the_settings_in_force(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    config = EngineConfig(model="m", speculative="prompt_lookup", kv_disk=True)
    loaded = SimpleNamespace(
        model_dir=tmp_path, tokenizer=None, max_model_len=2048, capacity_tokens=1024, config=config
    )
    served = ServedModel.from_engine(SimpleNamespace(engine=loaded), "m")
    stats = TestClient(create_app(_StatsEngine(), served)).get("/v1/engine/stats").json()
    assert stats["kv_cache_dtype"] == "fp8_e4m3"
    assert stats["settings"]["speculative"] == "prompt_lookup"
    assert stats["settings"] == config.model_dump(mode="json")


def _engine_lines_shown(text: str) -> None:
    for choice in LOCAL_ENGINE_CHOICES:
        assert f"{choice.setting}: " in text and choice.why.split(",")[0] in text, choice.setting
    assert "resident serve: none" in text  # speculative, as serve runs it


def test_the_repl_shows_the_settings(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("hello\n")
    settings = {**EngineConfig(model="m").model_dump(mode="json"), "kv_disk": True}
    stats = {"max_context_tokens": 8192, "capacity_tokens": 8192, "settings": settings}
    with ScriptedServer([], stats=stats) as server:
        args = ["--attach", server.url]
        result = runner.invoke(cli.app, args, input="/settings\n/quit\n")
    assert result.exit_code == 0, result.output
    for name in AgentConfig.model_fields:
        if name not in ("as_json", "plain", "verbose", "resume", "continue_last"):
            assert f"{name.replace('_', '-')}: " in result.output, name
    _engine_lines_shown(result.output)
    assert "runs with kv_disk=on, speculative=none, max_waiting=unset" in result.output


def test_the_tui_has_the_settings_command():
    assert any(command.name == "/settings" for command in SLASH_COMMANDS)
    assert callable(SlashCommands.do_settings)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_the_tui_shows_the_settings(tmp_path):
    from agent.tui.widgets.notes import Note
    from tests.agent.tui.helpers import make_app, ready, send, wait_until

    workspace = tmp_path / "repo"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("hello\n")
    with ScriptedServer([]) as server:
        app = make_app(server.url, workspace, tmp_path)
        async with app.run_test(size=(110, 40)) as pilot:
            await ready(pilot)
            await send(pilot, "/settings")

            def shown() -> str:
                return "\n".join(note.text for note in app.query(Note))

            await wait_until(pilot, lambda: "Engine settings" in shown(), "/settings")
            _engine_lines_shown(shown())
            assert "does not publish its settings" in shown()  # the scripted server does not
