"""What a stdio server's program needs in the sandbox (agent/core/mcp/program_paths.py): its
file, its `#!` interpreter, its virtual environment and base Python, and nothing else; a
hostile entry that names a secret gets nothing. Then a real venv-installed server, declared by
its full path, starting and listing its tools inside bubblewrap."""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agent.cli import app
from agent.core.mcp.config import load_config
from agent.core.mcp.launch import LaunchRefused, stdio_parameters
from agent.core.mcp.program_paths import ProgramPaths, ProgramRefused, program_paths
from tests.agent.mcp.helpers import DEMO, sandbox_for, write_config, write_user_config
from tools.sandbox.bubblewrap import Sandbox
from tools.sandbox.grants import SandboxSettings


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def fake_python(prefix: Path, version: str = "3.11") -> Path:
    """A Python install as the resolver recognises one: bin/pythonX.Y and its stdlib."""
    (prefix / "lib" / f"python{version}").mkdir(parents=True)
    (prefix / "lib" / f"python{version}" / "os.py").write_text("")
    return executable(prefix / "bin" / f"python{version}", "\x7fELF not really\n")


def fake_venv(root: Path, base: Path) -> Path:
    """A venv as `python -m venv` lays it out: pyvenv.cfg naming the base's bin/, and
    bin/python linking to the base interpreter."""
    (root / "bin").mkdir(parents=True)
    (root / "pyvenv.cfg").write_text(f"home = {base.parent}\nversion = 3.11.7\n")
    (root / "bin" / "python").symlink_to(base)
    (root / "bin" / "python3").symlink_to("python")
    return root


@pytest.fixture
def layout(tmp_path):
    """A home with a venv in it, a base Python outside it, and a workspace."""
    tmp = Path(os.path.realpath(tmp_path))
    home, workspace = tmp / "home" / "u", tmp / "ws"
    workspace.mkdir(parents=True)
    base = fake_python(tmp / "pythons" / "3.11")
    venv = fake_venv(home / "venvs" / "time", base)
    script = executable(venv / "bin" / "mcp-server-time", f"#!{venv}/bin/python\nmain()\n")
    return {"home": home, "ws": workspace, "base": base, "prefix": base.parent.parent,
            "venv": venv, "script": script}  # fmt: skip


def resolve(command: str, layout, search_path: str = "/usr/bin:/bin") -> ProgramPaths:
    return program_paths(
        command, search_path=search_path, workspace=layout["ws"], home=layout["home"]
    )


def test_a_console_script_brings_its_venv_and_the_base_python(layout):
    found = resolve(str(layout["script"]), layout)
    assert found.command == str(layout["script"])
    assert set(found.read_only) == {layout["venv"], layout["prefix"]}


def test_the_venv_python_keeps_its_own_path_so_it_finds_its_venv(layout):
    python = layout["venv"] / "bin" / "python"
    found = resolve(str(python), layout)
    assert found.command == str(python)  # not the base interpreter it links to
    assert set(found.read_only) == {layout["venv"], layout["prefix"]}


def test_a_name_is_looked_up_on_the_path_the_server_gets(layout, monkeypatch):
    search = f"{layout['home']}/nothing:{layout['venv']}/bin:/usr/bin"
    found = resolve("mcp-server-time", layout, search)
    assert found.command == "mcp-server-time"
    assert set(found.read_only) == {layout["venv"], layout["prefix"]}
    assert resolve("mcp-server-time", layout) == ProgramPaths("mcp-server-time")  # not found
    assert resolve("./server.py", layout) == ProgramPaths("./server.py")  # the workspace's
    monkeypatch.chdir(layout["venv"])  # a relative PATH entry is not the agent's folder
    assert resolve("mcp-server-time", layout, "bin") == ProgramPaths("mcp-server-time")


@pytest.mark.parametrize(
    "shebang",
    [
        "#!/usr/bin/env python3",
        "#!/usr/bin/env\tpython3",
        "#!/usr/bin/env -S python3 -u",
        "#!/usr/bin/env -S PYTHONUNBUFFERED=1 -u HOME python3",
        "#!{venv}/bin/python -u",
        "#!/bin/sh\n'''exec' \"{venv}/bin/python\" \"$0\" \"$@\"\n' '''",  # pip, long paths
    ],
)
def test_shebang_forms_lead_to_the_interpreter_and_its_venv(layout, shebang):
    tool = executable(layout["home"] / "tools" / "serve", shebang.format(**layout) + "\nrun()\n")
    found = resolve(str(tool), layout, f"{layout['venv']}/bin:/usr/bin:/bin")
    assert set(found.read_only) == {tool, layout["venv"], layout["prefix"]}


def test_env_without_split_looks_for_the_whole_argument_as_one_name(layout):
    tool = executable(layout["home"] / "tools" / "serve", "#!/usr/bin/env python3 -u\n")
    found = resolve(str(tool), layout, f"{layout['venv']}/bin:/usr/bin:/bin")
    assert found.read_only == (tool,)  # env itself would find no "python3 -u"


def test_symlinked_interpreters_are_followed_to_their_install(layout, tmp_path):
    link = layout["home"] / "links" / "py"
    link.parent.mkdir(parents=True)
    link.symlink_to(layout["base"])
    tool = executable(layout["home"] / "tools" / "serve", f"#!{link}\n")
    found = resolve(str(tool), layout)
    assert set(found.read_only) == {tool, layout["prefix"]}
    assert link.parent not in found.read_only


def test_a_link_outside_every_shown_folder_runs_by_the_path_it_points_to(layout):
    link = layout["home"] / ".local" / "bin" / "mcp-server-time"  # how pipx installs
    link.parent.mkdir(parents=True)
    link.symlink_to(layout["script"])
    found = resolve(str(link), layout)
    assert found.command == str(layout["script"])
    assert set(found.read_only) == {layout["venv"], layout["prefix"]}
    inside = program_paths(
        str(link),
        search_path="/usr/bin",
        workspace=layout["ws"],
        home=layout["home"],
        visible=(link.parent,),  # ~/.local/bin on the agent's PATH: shown already
    )
    assert inside.command == str(link)


def test_a_program_outside_a_venv_is_shown_alone_not_its_folder(layout):
    tools = layout["home"] / "tools"
    tool = executable(tools / "server", f"#!{layout['base']}\n")
    (tools / "notes.txt").write_text("private\n")
    found = resolve(str(tool), layout)
    assert set(found.read_only) == {tool, layout["prefix"]}
    assert tools not in found.read_only and layout["home"] not in found.read_only


def test_what_the_sandbox_shows_anyway_needs_no_mount(layout):
    assert resolve("/bin/sh", layout) == ProgramPaths("/bin/sh")
    script = executable(layout["ws"] / "serve", "#!/bin/sh\nexit 0\n")
    assert resolve(str(script), layout).read_only == ()


@pytest.mark.parametrize(
    "name", [".ssh/id_rsa", ".ssh/tool", ".aws/credentials", "keys/server.pem", "project/.env"]
)
def test_a_secret_looking_program_is_refused_even_when_executable(layout, name):
    secret = executable(layout["home"] / name, "#!/bin/sh\n")
    with pytest.raises(ProgramRefused, match="is not a program to run"):
        resolve(str(secret), layout)


def test_programs_named_like_credential_folders_still_run(layout):
    gcloud = executable(layout["home"] / "google-cloud-sdk" / "bin" / "gcloud", "\x7fELF\n")
    assert resolve(str(gcloud), layout).read_only == (gcloud,)


def test_a_python_installed_into_a_credentials_parent_is_shown_alone(layout):
    python = fake_python(layout["home"] / ".local")  # ./configure --prefix=$HOME/.local
    assert resolve(str(python), layout).read_only == (python,)  # never all of ~/.local


def test_a_file_that_is_not_an_executable_is_refused(layout):
    plain = layout["home"] / "notes.txt"
    plain.write_text("private\n")
    with pytest.raises(ProgramRefused, match="is not an executable file"):
        resolve(str(plain), layout)
    with pytest.raises(ProgramRefused, match="is not an executable file"):
        resolve(str(layout["home"]), layout)  # a folder


def test_a_workspace_script_cannot_name_a_secret_as_its_interpreter(layout):
    key = executable(layout["home"] / ".ssh" / "id_ed25519", "-----BEGIN KEY-----\n")
    script = executable(layout["ws"] / "serve", f"#!{key}\n")
    with pytest.raises(ProgramRefused, match="id_ed25519"):
        resolve(str(script), layout)
    env_script = executable(layout["ws"] / "serve2", "#!/usr/bin/env id_ed25519\n")
    with pytest.raises(ProgramRefused, match="inside a .ssh directory"):
        resolve(str(env_script), layout, f"{key.parent}:/usr/bin")


def test_a_workspace_venv_cannot_point_its_home_at_private_folders(layout):
    private = layout["home"] / "private"
    executable(private / "bin" / "python3", "#!/bin/sh\n")  # no stdlib: not a Python install
    for home in (layout["home"] / "bin", private / "bin"):
        venv = layout["ws"] / f"venv-{home.parent.name}"
        (venv / "bin").mkdir(parents=True)
        (venv / "pyvenv.cfg").write_text(f"home = {home}\n")
        tool = executable(venv / "bin" / "tool", "#!/bin/sh\n")
        assert resolve(str(tool), layout).read_only == ()


def test_a_venv_that_is_the_home_itself_shows_only_the_program(layout):
    home = layout["home"]
    (home / "pyvenv.cfg").write_text(f"home = {layout['base'].parent}\n")
    tool = executable(home / "bin" / "server", "#!/bin/sh\n")
    assert resolve(str(tool), layout).read_only == (tool,)


def test_an_interpreter_loop_ends(layout):
    first, second = layout["home"] / "a", layout["home"] / "b"
    executable(first, f"#!{second}\n")
    executable(second, f"#!{first}\n")
    assert set(resolve(str(first), layout).read_only) == {first, second}


def test_launch_mounts_the_program_and_refuses_a_secret(layout, tmp_path):
    key = executable(layout["home"] / ".ssh" / "id_rsa", "-----BEGIN KEY-----\n")
    user = write_config(tmp_path / "user-mcp.json", {"time": {"command": str(layout["script"])}})
    tool = executable(layout["home"] / "tools" / "server", "#!/bin/sh\n")
    tools = tool.parent
    repository = {"hostile": {"command": str(key)}, "tool": {"command": str(tool)}}
    write_config(layout["ws"] / ".resident" / "mcp.json", repository)
    config = load_config(layout["ws"], user_file=user, lookup=lambda _: None)
    sandbox = Sandbox("/usr/bin/bwrap", "system", "0.11.0", disable_userns=True)
    env = {"HOME": str(layout["home"]), "PATH": "/usr/bin:/bin"}
    params = stdio_parameters(config.servers["time"], layout["ws"], sandbox, SandboxSettings(), env)
    assert params.args[-2:] == ["--", str(layout["script"])]
    for folder in (layout["venv"], layout["prefix"]):
        at = params.args.index(str(folder))
        assert params.args[at - 1 : at + 2] == ["--ro-bind-try", str(folder), str(folder)]
    assert str(layout["home"] / "venvs") not in params.args
    assert str(key) not in params.args
    # A repository's (untrusted) entry naming a program in the home: the file, not its folder.
    own_tool = stdio_parameters(
        config.servers["tool"], layout["ws"], sandbox, SandboxSettings(), env
    )
    at = own_tool.args.index(str(tool))
    assert own_tool.args[at - 1 : at + 2] == ["--ro-bind-try", str(tool), str(tool)]
    assert str(tools) not in own_tool.args
    with pytest.raises(LaunchRefused, match="not started: .*id_rsa is not a program to run"):
        stdio_parameters(config.servers["hostile"], layout["ws"], sandbox, SandboxSettings(), env)


# --- end to end: a real venv outside the workspace, a console script, bubblewrap ---------


def make_server_venv(root: Path) -> Path:
    """A venv made from this interpreter, the demo server installed in it as a module with a
    console script whose shebang is the venv's python, the way pip installs one. The venv
    sees this interpreter's packages (the `mcp` SDK) through a .pth file."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    (packages,) = root.glob("lib/python*/site-packages")
    (packages / "resident_parent.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    shutil.copy(DEMO, packages / "demo_mcp_server.py")
    return executable(
        root / "bin" / "demo-mcp-server",
        f"#!{root}/bin/python\nimport runpy\n"
        'runpy.run_module("demo_mcp_server", run_name="__main__", alter_sys=True)\n',
    )


@pytest.fixture(scope="module")
def server_venv(tmp_path_factory):
    """A real venv outside any workspace, with the demo server installed; and a workspace."""
    workspace = Path(os.path.realpath(tmp_path_factory.mktemp("ws")))
    if sandbox_for(workspace) is None:
        pytest.skip("no sandbox on this machine")
    venv = Path(os.path.realpath(tmp_path_factory.mktemp("venvs"))) / "demo"
    return workspace, venv, make_server_venv(venv)


def test_a_venv_installed_server_named_by_full_path_starts_in_the_sandbox(server_venv):
    workspace, _, script = server_venv
    write_user_config({"demo": {"command": str(script), "startupTimeout": 60}})
    result = CliRunner().invoke(app, ["mcp", "list", "--json", "--workspace", str(workspace)])
    assert result.exit_code == 0, result.output
    (server,) = json.loads(result.output)["servers"]
    assert server["state"] == "ready", server
    assert server["sandbox"] == "bubblewrap: workspace read-only, network off"
    tools = {tool["name"] for tool in server["tools"]}
    assert {"mcp__demo__echo", "mcp__demo__add"} <= tools


def test_inside_the_sandbox_the_venv_is_readable_and_its_neighbours_are_not(server_venv):
    workspace, venv, script = server_venv
    neighbour = venv.parent / "notes.txt"
    neighbour.write_text("private\n")
    probe = "import os, sys; print(os.path.isfile(sys.argv[1]), os.listdir(sys.argv[2]))"
    user = write_config(
        workspace.parent / "probe-mcp.json",
        {"probe": {"command": str(venv / "bin" / "python"),
                   "args": ["-c", probe, str(script), str(venv.parent)]}},
    )  # fmt: skip
    config = load_config(workspace, user_file=user)
    params = stdio_parameters(
        config.servers["probe"], workspace, sandbox_for(workspace), SandboxSettings()
    )
    ran = subprocess.run(
        [params.command, *params.args], env=params.env, capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == 0, ran.stderr
    # The script is there; beside the venv there is nothing but the venv's mount point.
    assert ran.stdout.strip() == "True ['demo']"
