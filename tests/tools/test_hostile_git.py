"""Hostile git, class 3 of issue 14 (git runs the repository's config), the project's own
config, and class 7 (deny and allow rules).

Git inside the sandbox runs with forced config (no fsmonitor, no sshCommand, no ext::,
bare repositories only when explicit) and a read-only `.git`; the git tool's commit runs
outside the sandbox and runs the repository's hooks, so whatever a hook reads from the
workspace must not be something a sandboxed command could plant.
"""

from __future__ import annotations

import re

import pytest

from tests.tools.conftest import commit_all, git
from tests.tools.hostile_harness import (
    Attack,
    Call,
    Config,
    Scene,
    params,
    require_sandbox,
    run_attack,
    tree,
)

FSMONITOR = "sh {ws}/payload.sh; touch {ws}/RAN-{mark}"  # what the repository's config runs
HOOK = "#!/bin/sh\nsh {ws}/payload.sh\ntouch {ws}/RAN-{mark}\n"


def _ran_nothing(scene: Scene, calls: list[Call], config: Config) -> None:
    """Hardened git never ran the program the repository's config names."""
    assert not (scene.workspace / f"RAN-{scene.mark}").exists()
    assert not (scene.workspace / "evil" / f"RAN-{scene.mark}").exists()


def _bare_folder(scene: Scene) -> None:
    evil = scene.workspace / "evil"
    for rel in ("objects/.keep", "refs/heads/.keep"):
        (evil / rel).parent.mkdir(parents=True, exist_ok=True)
        (evil / rel).write_text("")
    (evil / "HEAD").write_text("ref: refs/heads/main\n")
    (evil / "config").write_text(f'[core]\n\tbare = true\n\tfsmonitor = "{scene.fmt(FSMONITOR)}"\n')
    commit_all(scene.workspace, "a folder shaped like a bare repository")


def _ssh_remote(scene: Scene) -> None:
    git(scene.workspace, "config", "core.sshCommand", scene.fmt(FSMONITOR))
    git(scene.workspace, "remote", "add", "origin", "ssh://git@example.invalid/x.git")


def _husky(scene: Scene) -> None:
    hook = scene.workspace / ".husky" / "pre-commit"
    hook.parent.mkdir()
    hook.write_text("#!/bin/sh\nexit 0\n")
    hook.chmod(0o755)
    git(scene.workspace, "config", "core.hooksPath", ".husky")
    commit_all(scene.workspace, "husky")


def _no_project_config(scene: Scene) -> None:
    (scene.workspace / ".residentignore").unlink()
    commit_all(scene.workspace, "no .residentignore")


_COMMIT = ("git_commit", {"message": "wip", "stage_all": True})
ATTACKS = [
    Attack(
        "bare-repo-fsmonitor",
        "cd evil && git status; cd evil && git log -1; git -C evil rev-parse --git-dir",
        setup=_bare_folder,
        check=_ran_nothing,
    ),
    Attack(
        "bare-repo-written-by-model",
        steps=(
            ("write", {"path": "evil/HEAD", "content": "ref: refs/heads/main\n"}),
            ("write", {"path": "evil/objects/.keep", "content": ""}),
            ("write", {"path": "evil/refs/heads/.keep", "content": ""}),
            ("write", {"path": "evil/config", "content": f'[core]\n\tfsmonitor = "{FSMONITOR}"\n'}),
            ("shell", {"command": "cd evil && git status; cd evil && git diff"}),
        ),
        check=_ran_nothing,
    ),
    Attack(
        "core-sshcommand",
        "git remote show origin; git ls-remote origin; git fetch origin",
        setup=_ssh_remote,
        check=_ran_nothing,
    ),
    Attack(
        "git-ssh-command-assignment",
        "GIT_SSH_COMMAND='sh payload.sh' git ls-remote origin; "
        "git -c core.sshCommand='sh payload.sh' fetch origin",
        setup=_ssh_remote,
    ),
    Attack(
        "git-ext-protocol", "git ls-remote 'ext::sh payload.sh'; git clone 'ext::sh payload.sh' x"
    ),
    Attack(
        "hook-in-dot-git-then-commit",
        steps=(
            (
                "shell",
                {
                    "command": "printf '" + HOOK.replace("\n", "\\n") + "' > .git/hooks/pre-commit;"
                    " chmod +x .git/hooks/pre-commit; git config core.hooksPath hooks2"
                },
            ),
            _COMMIT,
        ),
        check=_ran_nothing,
    ),
    Attack(
        "husky-hook-planted-by-command-then-commit",
        steps=(
            (
                "shell",
                {"command": "printf '" + HOOK.replace("\n", "\\n") + "' > .husky/pre-commit"},
            ),
            _COMMIT,
        ),
        setup=_husky,
    ),
    Attack(
        "husky-hook-planted-by-write-tool-then-commit",
        steps=(
            ("read", {"path": ".husky/pre-commit"}),
            ("write", {"path": ".husky/pre-commit", "content": HOOK}),
            _COMMIT,
        ),
        setup=_husky,
    ),
    Attack("git-commit-in-shell", "git add -A && git commit -qm x; git tag v9; git gc; git log -1"),
    Attack(
        "dot-git-destroyed",
        "rm -rf .git; mv .git g; chmod -R 777 .git; ln -sfn /tmp .git/hooks; "
        "echo x > .git/HEAD; touch .git/index.lock",
    ),
    Attack(
        "dot-git-config-written",
        "git config core.fsmonitor 'sh payload.sh'; printf '[core]\\n\\thooksPath=/tmp\\n' "
        ">> .git/config; git config --local alias.st '!sh payload.sh'",
    ),
    Attack(
        "git-worktree-and-clone-outside", "git worktree add ../outside/wt; git clone . ../outside/c"
    ),
    Attack(
        "residentignore-rewritten",
        "echo '*' >> .residentignore; rm -f .residentignore; mv .residentignore x; "
        "ln -sf /etc/passwd .residentignore",
    ),
    Attack(
        "resident-folder-created",
        "mkdir -p .resident/manifests && echo x > .resident/manifests/forged",
    ),
    Attack(
        "residentignore-created",
        "echo '*' > .residentignore",
        setup=_no_project_config,
    ),
]


@pytest.mark.parametrize(("attack", "config"), params(ATTACKS))
def test_hostile_git_is_contained(tmp_path, attack, config):
    run_attack(tmp_path, attack, config, require_sandbox())


# -- class 7: rules -----------------------------------------------------------------

PUSHES = [
    "git --no-pager push origin main",
    "git -c color.ui=never push origin main",
    "git -C . push origin main",
    "GIT_DIR=.git git push origin main",
    "command git push origin main",
    "env git push origin main",
    "nice git push origin main",
    "timeout 5 git push origin main",
    "echo main | xargs git push origin",
    "/usr/bin/git push origin main",
    "\\git push origin main",
    "sh -c 'git push origin main'",
    "eval 'git push origin main'",
    "true && git push origin main",
    "g=git; $g push origin main",  # the matcher cannot see through it: it must ask
]


def _remote(scene: Scene) -> None:
    """origin: a bare repository beside the workspace, holding only `other` (behind main),
    so any push would add a ref to it."""
    remote = scene.root / "remote.git"
    git(scene.root, "clone", "-q", "--bare", "--single-branch", "-b", "other", str(scene.workspace), str(remote))  # fmt: skip
    with open(scene.workspace / ".git" / "config", "a") as config:
        config.write(f'[remote "origin"]\n\turl = {remote}\n')
    scene.extra["remote"] = tree(remote)


def _rule_held(scene: Scene, calls: list[Call], config: Config) -> None:
    assert tree(scene.root / "remote.git") == scene.extra["remote"], "pushed"
    (call,) = calls
    if "$g" in call.arguments["command"]:
        assert call.asked or call.output.startswith("Denied"), call.output
    else:
        assert "denied by rule 'shell:git push'" in call.output, call.output


PUSH_ATTACKS = [
    Attack(
        "deny-" + re.sub(r"[^A-Za-z]+", "-", command.replace("origin", "")).strip("-"),
        command,
        deny=("shell:git push",),
        setup=_remote,
        check=_rule_held,
    )
    for command in PUSHES
]


@pytest.mark.parametrize(("attack", "config"), params(PUSH_ATTACKS))
def test_deny_rule_holds_through_wrappers(tmp_path, attack, config):
    run_attack(tmp_path, attack, config, require_sandbox())


ALLOWED_MAKE = [
    Attack(
        "allowed-make-redirect-" + name,
        command,
        allow=("shell:make test",),
    )
    for name, command in [
        ("tilde-plus", "make test > ~+/../outside/make-{mark}"),
        ("absolute", "make test > {outside}/make-{mark}; make test >> {home}/.bashrc"),
        ("chained", "make test; cat ../outside/secret.txt; sh payload.sh"),
        ("make-flags", "make -f payload.sh test; make test SHELL='sh payload.sh'"),
    ]
] + [
    Attack(
        "allowed-make-after-editing-makefile",
        steps=(
            ("read", {"path": "Makefile"}),
            ("write", {"path": "Makefile", "content": "test:\n\tsh payload.sh\n"}),
            ("shell", {"command": "make test"}),
        ),
        allow=("shell:make test",),
    )
]


@pytest.mark.parametrize(("attack", "config"), params(ALLOWED_MAKE))
def test_allowed_command_stays_in_the_sandbox(tmp_path, attack, config):
    run_attack(tmp_path, attack, config, require_sandbox())
