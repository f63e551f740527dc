"""Issue 38: every file a repository ships, or the user's config holds, is read bounded.

Each of hooks.json, mcp.json (the repository's and the user's), the trust records,
custom commands, AGENTS.md and .residentignore, as a link to /dev/zero, a FIFO and
an over-size file: a clear problem, a skip or a warning, never a hang. The link to
/dev/zero is read in a child with a memory limit and a deadline, so a reader that
reads it whole fails the test instead of taking the machine's memory.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.agent.bounded_probes import PROBES, place, probe
from tests.hostile_files import OVERSIZE_BYTES, SHAPES, finishes, make_hostile, run_isolated

LINK_TO_ZERO = "is a character device, not a regular file (it is a symbolic link to /dev/zero)"
FIFO = "is a FIFO (named pipe), not a regular file"
TOO_LARGE = f"is {OVERSIZE_BYTES:,} bytes; it may have at most "

# What a person is told, by file and shape; a regular expression searched for.
EXPECTED = {
    ("repository hooks.json", "dev_zero"): re.escape(f"hooks.json: not read: it {LINK_TO_ZERO}"),
    ("repository hooks.json", "fifo"): re.escape(f"hooks.json: not read: it {FIFO}"),
    ("repository hooks.json", "oversize"): re.escape(f"hooks.json: not read: it {TOO_LARGE}"),
    ("user hooks.json", "dev_zero"): re.escape(f"hooks.json: not read: it {LINK_TO_ZERO}"),
    ("user hooks.json", "fifo"): re.escape(f"hooks.json: not read: it {FIFO}"),
    ("user hooks.json", "oversize"): re.escape(f"hooks.json: not read: it {TOO_LARGE}"),
    ("repository mcp.json", "dev_zero"): re.escape(f"mcp.json: not read: it {LINK_TO_ZERO}"),
    ("repository mcp.json", "fifo"): re.escape(f"mcp.json: not read: it {FIFO}"),
    ("repository mcp.json", "oversize"): re.escape(f"mcp.json: not read: it {TOO_LARGE}"),
    ("user mcp.json", "dev_zero"): re.escape(f"mcp.json: not read: it {LINK_TO_ZERO}"),
    ("user mcp.json", "fifo"): re.escape(f"mcp.json: not read: it {FIFO}"),
    ("user mcp.json", "oversize"): re.escape(f"mcp.json: not read: it {TOO_LARGE}"),
    ("trust records", "dev_zero"): re.escape(LINK_TO_ZERO) + r".*nothing is trusted|"
    r"nothing is trusted.*" + re.escape(LINK_TO_ZERO),
    ("trust records", "fifo"): re.escape(FIFO),
    ("trust records", "oversize"): re.escape(TOO_LARGE),
    # A repository's command may not lead out of the repository at all.
    ("repository command", "dev_zero"): re.escape(
        "review.md is not used: it is a link to /dev/zero, outside the repository"
    ),
    ("repository command", "fifo"): re.escape(f"review.md is not used: it {FIFO}"),
    ("repository command", "oversize"): re.escape(f"review.md is not used: it {TOO_LARGE}"),
    ("user command", "dev_zero"): re.escape(f"review.md is not used: it {LINK_TO_ZERO}"),
    ("user command", "fifo"): re.escape(f"review.md is not used: it {FIFO}"),
    ("user command", "oversize"): re.escape(f"review.md is not used: it {TOO_LARGE}"),
    ("AGENTS.md", "dev_zero"): re.escape("AGENTS.md: symbolic link leading outside the workspace"),
    ("AGENTS.md", "fifo"): re.escape(f"AGENTS.md {FIFO}"),
    ("AGENTS.md", "oversize"): re.escape("[AGENTS.md is over 64 KiB: the rest of it is not read]"),
    # Ignore files are read as git reads them: never through a link, at most 1 MiB.
    (".residentignore", "dev_zero"): "^0 rules$",
    (".residentignore", "fifo"): "^0 rules$",
    (".residentignore", "oversize"): r"^\d+ rules$",
}


@pytest.fixture
def folders(tmp_path):
    workspace, config = tmp_path / "repo", tmp_path / "config"
    workspace.mkdir()
    config.mkdir()
    return Path(os.path.realpath(workspace)), Path(os.path.realpath(config))


def test_every_file_and_shape_has_an_expectation():
    assert set(EXPECTED) == {(name, shape) for name in PROBES for shape in SHAPES}


@pytest.mark.parametrize("name", sorted(PROBES))
@pytest.mark.parametrize("shape", ["fifo", "oversize"])
def test_a_fifo_or_an_oversize_file_is_told_not_waited_on(name, shape, folders):
    workspace, config = folders
    path = place(name, workspace, config)
    make_hostile(path, shape)
    told = finishes(lambda: probe(name, workspace, config), fifo=path if shape == "fifo" else None)
    assert re.search(EXPECTED[(name, shape)], told), told


@pytest.mark.parametrize("name", sorted(PROBES))
def test_a_link_to_dev_zero_is_told_not_read_forever(name, folders):
    workspace, config = folders
    make_hostile(place(name, workspace, config), "dev_zero")
    done = run_isolated(["-m", "tests.agent.bounded_probes", name, str(workspace), str(config)])
    assert done.returncode == 0, done.stderr[-2000:]
    assert re.search(EXPECTED[(name, "dev_zero")], done.stdout), done.stdout


@pytest.mark.parametrize(
    ("command", "name"),
    [
        ("hooks list", "repository hooks.json"),
        ("hooks trust", "repository hooks.json"),
        ("hooks list", "user hooks.json"),
        ("mcp list", "repository mcp.json"),
        ("mcp list", "user mcp.json"),
    ],
)
def test_the_cli_reports_a_link_to_dev_zero_and_exits(command, name, folders):
    """The finding: `resident hooks list` (and session start) read such a link forever."""
    workspace, config = folders
    make_hostile(place(name, workspace, config), "dev_zero")
    done = run_isolated(
        ["-m", "agent.cli", *command.split(), "-w", str(workspace)],
        env={"RESIDENT_CONFIG_DIR": str(config)},
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert re.search(EXPECTED[(name, "dev_zero")], done.stdout + done.stderr)
