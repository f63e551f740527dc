"""Every engine setting is declared once, in EngineConfig (issue #27): the commands'
options, ServeOptions, the KV pool's dtypes and the attention registry derive from
it. Each test here fails when a default or a list of allowed values is restated
somewhere and drifts from the declaration."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from typing import Any, get_args

import pytest
import torch
import typer
from typer.testing import CliRunner

from engine.attention.names import BACKEND_NAMES
from engine.attention.registry import BACKENDS
from engine.cli import engine_app
from engine.config import (
    DTypeName,
    EngineConfig,
    default_setting,
    setting_choices,
    setting_help,
)
from engine.execution.rank_model import resolve_dtype
from engine.kv.dtypes import KV_DTYPES, resolve_kv_dtype
from engine.kv.pool_base import STORAGE_DTYPES
from engine.kv.sizing import KV_DTYPE_BYTES
from engine.model_files.store import DEFAULT_MODEL_NAME
from engine.server import launch
from engine.server.options import (
    SERVE_DEFAULTS,
    SERVE_SETTINGS,
    ServeOptions,
    flag_of,
)

runner = CliRunner()


def _commands(group: Any, path: str = "") -> dict[str, Any]:
    """Every command under `group` (typer's click), by its path (`bench prefix`)."""
    if not hasattr(group, "commands"):
        return {path.strip(): group}
    found = {}
    for name, command in group.commands.items():
        found.update(_commands(command, f"{path} {name}"))
    return found


def _serve_params() -> dict[str, Any]:
    serve = typer.main.get_command(engine_app).commands["serve"]
    return {param.name: param for param in serve.params}


def _metavar_choices(param: Any) -> list[str]:
    return (param.metavar or "").strip("[]").split("|")


def test_serve_options_are_the_declared_settings():
    params = _serve_params()
    assert set(SERVE_SETTINGS) <= set(params)
    for name in SERVE_SETTINGS:
        param, declared = params[name], EngineConfig.model_fields[name]
        expected = SERVE_DEFAULTS[name] if name in SERVE_DEFAULTS else declared.default
        assert param.default == expected, name
        assert getattr(ServeOptions(), name) == expected, name
        assert param.help.startswith(setting_help(name)), name
        choices = setting_choices(name)
        if choices:
            assert _metavar_choices(param) == list(choices), name
        assert flag_of(name) in param.opts, name


def test_serve_keeps_its_flags():
    """The flags `resident serve` had before its options were derived."""
    flags = {flag for param in _serve_params().values() for flag in param.opts}
    flags |= {flag for param in _serve_params().values() for flag in param.secondary_opts}
    assert flags == {
        *("--model", "-m", "--host", "--port", "--api-key", "--dtype", "--kv-cache-dtype"),
        *("--kv-rotation", "--kv-scales", "--kv-scales-per-head", "--max-num-seqs"),
        *("--max-waiting", "--kv-memory", "--deterministic", "--no-deterministic"),
        *("--max-model-len", "--attention-backend", "--cpu-kernel", "--kv-disk"),
        *("--no-kv-disk", "--kv-host-gib", "--speculative", "--tp", "--ep", "--nnodes"),
        *("--node-rank", "--master-addr", "--master-port"),
        *("--cuda-graphs", "--no-cuda-graphs"),  # added with the CUDA-graph decode (#28)
        *("--fp8-decode-dots", "--no-fp8-decode-dots"),  # FP8 tensor-core decode (#28)
        "--stream-interval-ms",  # streamed tokens paced (#25)
        "--cpu-weights",  # dense weights quantized at load (#37)
        "--kv-events",  # KV events for cache-aware routers (#40)
        "--speculative-mtp-tokens",  # MTP draft length (#41)
    }


def test_no_command_restates_a_setting_default_or_choices():
    from agent.cli import app

    commands = {
        **_commands(typer.main.get_command(app)),
        **_commands(typer.main.get_command(engine_app)),
    }
    checked = 0
    for path, command in commands.items():
        for param in command.params:
            if param.name not in EngineConfig.model_fields:
                continue
            checked += 1
            if param.name == "model":
                allowed = {None, DEFAULT_MODEL_NAME}
            else:
                allowed = {None, default_setting(param.name)}
                if path == "serve":
                    allowed.add(SERVE_DEFAULTS.get(param.name))
            assert param.default in allowed, (path, param.name, param.default)
            choices = setting_choices(param.name)
            if choices:
                assert _metavar_choices(param) == list(choices), (path, param.name)
    assert checked > len(SERVE_SETTINGS)  # serve's, bench's and calibrate's at least


@pytest.fixture
def served(monkeypatch):
    seen: list[Any] = []
    monkeypatch.setattr(launch, "serve", lambda options: seen.append(options))
    return seen


def test_kv_cache_dtype_takes_exactly_the_declared_names(served):
    for name in ("auto", *KV_DTYPES):
        result = runner.invoke(engine_app, ["serve", "--kv-cache-dtype", name])
        assert result.exit_code == 0, result.output
    assert [o.kv_cache_dtype for o in served] == ["auto", *KV_DTYPES]
    result = runner.invoke(engine_app, ["serve", "--kv-cache-dtype", "fp16"])
    assert result.exit_code == 2
    allowed = ", ".join(("auto", *KV_DTYPES))
    assert f"--kv-cache-dtype must be one of {allowed}, not 'fp16'" in result.output


def test_every_choice_flag_names_its_allowed_values(served):
    for name in SERVE_SETTINGS:
        choices = setting_choices(name)
        if not choices:
            continue
        flag = flag_of(name)
        result = runner.invoke(engine_app, ["serve", flag, "no-such-value"])
        assert result.exit_code == 2, (name, result.output)
        assert f"{flag} must be one of {', '.join(choices)}" in result.output


def test_what_auto_picks_is_a_kv_dtype_the_cli_accepts():
    accepted = setting_choices("kv_cache_dtype")
    for model_dtype in get_args(DTypeName):
        for checkpoint in (None, "float32", "bfloat16"):
            dtype = resolve_dtype(model_dtype, checkpoint, torch.device("cpu"))
            picked = resolve_kv_dtype("auto", dtype)
            assert picked in accepted and picked != "auto", (model_dtype, checkpoint)
    assert resolve_kv_dtype("auto", torch.float32) == "float32"  # as before: no narrowing


def test_the_kv_dtype_tables_derive_from_one_declaration():
    assert set(setting_choices("kv_cache_dtype")) == {"auto", *KV_DTYPES}
    assert tuple(STORAGE_DTYPES) == tuple(KV_DTYPE_BYTES) == KV_DTYPES
    for name, dtype in STORAGE_DTYPES.items():
        assert dtype.itemsize == KV_DTYPE_BYTES[name], name


def test_the_attention_backends_are_named_once():
    assert tuple(BACKENDS) == BACKEND_NAMES == setting_choices("attention_backend")
    assert setting_choices("attention_backend") == launch_choices("attention_backend")


def launch_choices(name: str) -> tuple[str, ...]:
    """What check_options accepts for setting `name`, found by asking it."""
    accepted = []
    for value in setting_choices(name) + ("no-such-value",):
        try:
            launch.check_options(ServeOptions(**{name: value}))
            accepted.append(value)
        except launch.ServeUsageError:
            pass
    return tuple(accepted)


def _other_value(name: str) -> Any:
    """A valid value of setting `name` other than its serve default."""
    declared = EngineConfig.model_fields[name]
    default = getattr(ServeOptions(), name)
    choices = setting_choices(name)
    if choices:
        return next(c for c in choices if c != default)
    if isinstance(default, bool):
        return not default
    if declared.annotation is str or declared.annotation == str | None:
        return f"{name}-value"
    return 3  # every number setting serve exposes allows 3


PARALLEL = {"tensor_parallel_size": 4, "nnodes": 2, "node_rank": 1, "master_port": 29511}
# Strings with a shape of their own (a made-up string would not validate).
SHAPED = {"kv_events": "tcp://127.0.0.1:5557"}


def test_engine_config_round_trips_every_serve_setting():
    given = PARALLEL | SHAPED
    values = {name: given.get(name, _other_value(name)) for name in SERVE_SETTINGS}
    config = launch.engine_config(ServeOptions(**values))
    for name, value in values.items():
        assert getattr(config, name) == value, name
    defaults = launch.engine_config(ServeOptions())
    for name in SERVE_SETTINGS:
        assert getattr(defaults, name) == getattr(ServeOptions(), name), name


def test_serve_options_hold_no_setting_of_their_own():
    """Every field of ServeOptions is the server's own or a declared setting."""
    own = {"host", "port", "api_key", "log_level"}
    names = {f.name for f in dataclasses.fields(ServeOptions)}
    assert names == own | set(SERVE_SETTINGS)
    assert set(SERVE_SETTINGS) <= set(EngineConfig.model_fields)


def test_the_declarations_import_without_torch():
    code = (
        "import sys, engine.cli, engine.config, engine.server.options, engine.kv.dtypes; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
