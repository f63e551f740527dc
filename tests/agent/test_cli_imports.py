"""What a `resident` command loads before it runs: `resident serve` shares the agent's CLI,
and every tool (the shell and web permission rules, the HTML reader, GitPython) was
imported for an enum, 0.4 s of each command's start. `tools` hands its names out on
first use."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch", "tools.web.tool", "tools.permissions.shell_rules", "tools.git.tool", "git")


def test_the_cli_imports_no_tool_and_no_torch():
    code = (
        "import sys, agent.cli; "
        f"loaded = [name for name in {HEAVY!r} if name in sys.modules]; "
        "assert not loaded, loaded"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_tools_package_still_hands_out_every_name():
    import tools
    from tools.permissions.policy import ApprovalMode

    assert tools.ApprovalMode is ApprovalMode
    for name in tools.__all__:
        assert getattr(tools, name) is not None, name
    assert {tool.name for tool in tools.default_tools()} == set(tools.default_registry().names())
    assert "ShellTool" in dir(tools)
