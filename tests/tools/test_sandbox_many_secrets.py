"""A workspace with thousands of secret-looking files: bubblewrap takes at most 9,000
arguments, so masking each file on its own would break the sandbox. Whole folders stand
in for their files, every secret stays hidden, and the workspace itself is never hidden."""

from __future__ import annotations

import logging
import random
from pathlib import Path, PurePosixPath

import pytest

from tools import ToolContext, ToolLimits, default_registry
from tools.sandbox.bubblewrap import Sandbox, SandboxUnavailable, detect_sandbox
from tools.sandbox.grants import READ_ONLY, SandboxGrant
from tools.sandbox.mask_budget import (
    BWRAP_MAX_ARGS,
    MASK_PATH_BUDGET,
    MaskBudgetExceeded,
    collapse_masked,
)

WS = PurePosixPath("/repo")
FULL_AUTO = SandboxGrant(write=True)  # writes without a person: secrets stay hidden
APPROVED = SandboxGrant(write=True, secrets=True)


def paths(*names: str) -> list[PurePosixPath]:
    return [WS / name for name in names]


def files(folder: str, count: int, name: str = "key{}.pem") -> list[PurePosixPath]:
    return [WS / folder / name.format(i) for i in range(count)]


# --- the collapse, on synthetic paths -------------------------------------------------


def test_within_budget_paths_come_back_sorted_without_duplicates_or_deeper_paths():
    masked = paths("src/.env", ".ssh", ".ssh/id_rsa", "a/id_rsa", "src/.env", ".env")
    assert collapse_masked(masked, WS, max_paths=10) == paths(
        ".env", ".ssh", "a/id_rsa", "src/.env"
    )


def test_the_folder_holding_the_most_is_masked_whole_and_nothing_more():
    masked = [
        *files("tests/fixtures", 50),
        *files("tests/fixtures/nested", 5),
        *files("config", 4, ".env.{}"),
        *paths(".env", "src/id_rsa"),
    ]
    result = collapse_masked(masked, WS, max_paths=10)
    assert result == [
        WS / ".env",
        *sorted(files("config", 4, ".env.{}")),
        WS / "src/id_rsa",
        WS / "tests/fixtures",
    ]
    assert len(result) <= 10


def test_collapsing_goes_on_until_the_budget_holds():
    masked = [*files("a", 6), *files("b", 5), *files("c", 4), *files("d", 3)]
    assert collapse_masked(masked, WS, max_paths=10) == [
        WS / "a",
        WS / "b",
        *sorted(files("c", 4)),
        *sorted(files("d", 3)),
    ]


def test_many_folders_of_one_secret_each_collapse_into_their_parent():
    masked = [WS / "packages" / f"p{i}" / ".env" for i in range(40)]
    assert collapse_masked([*masked, WS / ".env"], WS, max_paths=5) == paths(".env", "packages")


def test_a_folder_hidden_early_gives_way_to_its_parent_hidden_later(caplog):
    masked = [p for d in range(6) for s in range(3) for p in files(f"d{d}/s{s}", 4)]
    with caplog.at_level(logging.WARNING, logger="tools.sandbox.mask_budget"):
        result = collapse_masked(masked, WS, max_paths=6)
    assert result == [WS / f"d{d}" for d in range(6)]
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "/repo/d5 (12)" in logged and "/s0" not in logged


def test_long_paths_are_kept_within_the_byte_budget():
    masked = files("deep", 20, "x" * 200 + "{}.pem")
    assert collapse_masked(masked, WS, max_paths=1_000, max_bytes=4_096) == paths("deep")


def test_the_result_does_not_depend_on_the_scan_order():
    masked = [*files("fixtures", 30), *files("more", 8), *paths(".env", "x/.env")]
    expected = collapse_masked(masked, WS, max_paths=12)
    random.Random(7).shuffle(masked)
    assert collapse_masked(masked, WS, max_paths=12) == expected


def test_the_workspace_itself_is_never_masked():
    masked = [*files(".", 20, ".env.{}"), *files("sub", 3)]
    with pytest.raises(MaskBudgetExceeded) as err:
        collapse_masked(masked, WS, max_paths=5)
    message = str(err.value)
    assert "/repo" in message and "23" in message and "hiding the workspace itself" in message


def test_secrets_beside_the_workspace_root_stay_unmasked_by_the_root():
    # The root holds 3 directly: collapsing the folder is enough, the root is not needed.
    masked = [*paths(".env", "a.pem", "b.pem"), *files("fixtures", 20)]
    assert collapse_masked(masked, WS, max_paths=5) == paths(".env", "a.pem", "b.pem", "fixtures")


def test_paths_outside_the_workspace_and_bad_budgets_are_refused():
    with pytest.raises(ValueError, match="not inside the workspace"):
        collapse_masked([PurePosixPath("/elsewhere/.env")], WS)
    with pytest.raises(ValueError, match="not inside the workspace"):
        collapse_masked([WS], WS)
    with pytest.raises(ValueError, match="positive"):
        collapse_masked(paths(".env"), WS, max_paths=0)


def test_each_collapse_is_logged_once(caplog, tmp_path):
    workspace = PurePosixPath(tmp_path)  # a folder no other test collapses
    masked = [workspace / "keys" / f"k{i}.pem" for i in range(30)]
    with caplog.at_level(logging.WARNING, logger="tools.sandbox.mask_budget"):
        collapse_masked(masked, workspace, max_paths=5)
        collapse_masked(masked, workspace, max_paths=5)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1
    assert str(workspace / "keys") in lines[0] and "30" in lines[0]
    assert "other files included" in lines[0]


# --- the real sandbox -----------------------------------------------------------------

SECRET_FILES = 5_000


@pytest.fixture
def bwrap_works(tmp_path) -> None:
    """Skip where bubblewrap cannot run at all (judged on an empty workspace, so that a
    sandbox broken by the secrets below fails instead of skipping)."""
    empty = tmp_path / "empty"
    empty.mkdir()
    found = detect_sandbox(empty)
    if isinstance(found, SandboxUnavailable):
        pytest.skip(found.reason)


@pytest.fixture
def crowded(workspace) -> Path:
    """~5,000 keys in one fixture folder, a few secrets elsewhere, ordinary files beside."""
    keys = workspace / "tests" / "fixtures" / "keys"
    keys.mkdir(parents=True)
    for i in range(SECRET_FILES):
        (keys / f"key{i}.pem").write_text(f"KEY-MATERIAL-{i}\n")
    (keys / "README.txt").write_text("generated test keys\n")
    (workspace / ".env").write_text("API_TOKEN=hunter2\n")
    (workspace / "config").mkdir()
    (workspace / "config" / "id_rsa").write_text("PRIVATE KEY\n")
    (workspace / "src").mkdir()
    (workspace / "src" / "main.py").write_text("print('hello')\n")
    (workspace / "tests" / "test_main.py").write_text("def test(): pass\n")
    return workspace


def shell(ctx: ToolContext, command: str, grant: SandboxGrant = READ_ONLY, **extra):
    return default_registry().call("shell", {"command": command, **extra}, ctx, grant)


def test_the_sandbox_works_and_hides_every_secret(bwrap_works, crowded, caplog):
    with caplog.at_level(logging.WARNING, logger="tools.sandbox.mask_budget"):
        sandbox = detect_sandbox(crowded)
    assert isinstance(sandbox, Sandbox), sandbox
    keys = crowded / "tests" / "fixtures" / "keys"
    assert any(str(keys) in r.getMessage() for r in caplog.records)

    argv = sandbox.wrap(["true"], workspace=crowded, cwd=crowded, env={})
    assert len(argv) <= BWRAP_MAX_ARGS
    assert argv[argv.index(str(keys)) - 1] == "--tmpfs"  # the folder, masked whole
    assert argv[argv.index(str(crowded / ".env")) - 2] == "--ro-bind"

    ctx = ToolContext(workspace=crowded, sandbox=sandbox, limits=ToolLimits(shell_kill_grace_s=0.3))
    reads = (
        "cat tests/fixtures/keys/key17.pem tests/fixtures/keys/key4999.pem; cat .env; "
        "cat config/id_rsa; ls -A tests/fixtures/keys | wc -l; cat src/main.py tests/test_main.py"
    )
    for grant in (READ_ONLY, FULL_AUTO):
        result = shell(ctx, reads, grant)
        for secret in ("KEY-MATERIAL", "hunter2", "PRIVATE KEY", "generated test keys"):
            assert secret not in result.output, (grant, result.output)
        assert "print('hello')" in result.output and "def test(): pass" in result.output
        assert "\n0\n" in f"\n{result.output}\n"  # the keys folder lists empty

    approved = shell(ctx, "cat tests/fixtures/keys/key17.pem .env", APPROVED)
    assert approved.ok and "KEY-MATERIAL-17" in approved.output and "hunter2" in approved.output


def test_a_command_cannot_start_inside_a_hidden_folder(bwrap_works, crowded):
    sandbox = detect_sandbox(crowded)
    assert isinstance(sandbox, Sandbox), sandbox
    ctx = ToolContext(workspace=crowded, sandbox=sandbox)
    result = shell(ctx, "cat key1.pem", workdir="tests/fixtures/keys")
    assert not result.ok and "KEY-MATERIAL" not in result.output
    assert "hides" in result.output and "needs approval" in result.output


def test_secrets_only_the_workspace_could_hide_make_commands_ask(bwrap_works, workspace):
    for i in range(MASK_PATH_BUDGET + 10):  # all directly in the workspace root
        (workspace / f".env.{i}").write_text(f"TOKEN={i}-hunter2\n")
    sandbox = detect_sandbox(workspace)
    assert isinstance(sandbox, Sandbox), sandbox  # bubblewrap works; this command cannot
    ctx = ToolContext(workspace=workspace, sandbox=sandbox)
    result = shell(ctx, "cat .env.1")
    assert not result.ok and "hunter2" not in result.output
    assert f"{MASK_PATH_BUDGET + 10:,}" in result.output and str(workspace) in result.output
    assert "needs approval" in result.output
    assert "1-hunter2" in shell(ctx, "cat .env.1", APPROVED).output
