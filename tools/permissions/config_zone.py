"""Resident's configuration and state as the permission policy judges them.

A later session obeys what lies there without asking anyone: the user's
hooks run unconfined in every repository, the trust records decide which
repository's hooks and servers run, journals are replayed, checkpoints
written back, kernels loaded. So a model that could write there would act
with the person's rights long after its own call was judged. The zones
(tools.workspace.protected):

- the user's state dirs (config, data, cache), wherever they lie, the
  workspace included: a file tool never writes there, in any mode, whoever
  would approve it; the person changes them with an editor or Resident's
  own commands (`resident hooks trust`, `resident mcp trust`). Reading the
  config and data dirs asks: they hold tokens and whole conversations;
- a repository's `.resident/` and `.residentignore`: a write asks, every
  time, by name. Auto-edit, full-auto, allow rules and "allow for this
  session" never cover it (`Decision.once`); read-only and plan mode deny it.

These rulings only ever tighten what the rest of the policy decided.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tools.base import Effect
from tools.permissions.approval import ApprovalMode, Verdict
from tools.workspace.paths import ResolvedPath
from tools.workspace.protected import StateDir, describe, is_project_config, state_dir_of

CHANGE_IT_YOURSELF = "change it yourself (an editor, `resident hooks trust`, `resident mcp trust`)"


@dataclass(frozen=True)
class ZoneRuling:
    verdict: Verdict
    reason: str
    once: bool = False  # asked every time: never remembered, never lifted by a mode or rule


def state_write_refusal(path: ResolvedPath, state: StateDir) -> str:
    return (
        f"{path.display} is inside {describe(state)}; no tool the model drives changes it, "
        f"in any mode: {CHANGE_IT_YOURSELF}"
    )


def judge_zones(
    effect: Effect,
    resolved: Sequence[ResolvedPath],
    state_dirs: Iterable[StateDir],
    mode: ApprovalMode,
) -> ZoneRuling | None:
    """What the zones say about a call touching `resolved`, or None when none is touched."""
    dirs = tuple(state_dirs)
    if effect is Effect.WRITE:
        for path in resolved:
            state = state_dir_of(path.real, dirs)
            if state is not None:
                return ZoneRuling(Verdict.DENY, state_write_refusal(path, state))
        for path in resolved:
            if not is_project_config(path):
                continue
            if mode.read_only:
                return ZoneRuling(Verdict.DENY, f"{mode.value} mode does not allow changes")
            return ZoneRuling(
                Verdict.ASK,
                f"{path.display} is this repository's Resident configuration (hooks, MCP "
                "servers, commands, ignore rules), so each change there is asked for by name, "
                "whatever the mode or allow rules",
                once=True,
            )
        return None
    if effect is Effect.READ:
        for path in resolved:
            state = state_dir_of(path.real, dirs)
            if state is not None and state.private:
                return ZoneRuling(
                    Verdict.ASK,
                    f"{path.display} is inside {describe(state)}, which may hold tokens and "
                    "whole conversations",
                )
    return None
