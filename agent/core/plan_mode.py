"""Plan mode: explore read-only, propose a plan, carry it out once the user approves it.

The permission policy judges tool calls in plan mode exactly as in read-only
mode (`ApprovalMode.read_only`). What makes it plan mode lives here, and the
front ends (TUI, REPL, headless, ACP) only show it and pass the user's choice in:

- The model learns it is planning from the user's message of each task run in
  plan mode (prompts/plan_mode.md appended to the task), never from the system
  prompt: the system prompt and the tools are the cached resident prefix and
  stay byte-identical whatever the mode. The conversation, and so the session
  on disk, keeps the message as the model saw it.
- A task that ran in plan mode from start to end and ended with an answer has
  proposed a plan: the loop emits `plan_proposed` with the answer and its
  TaskOutcome says `plan=True`.
- The user then picks one of PLAN_CHOICES: carry the plan out in ask,
  auto-edit or full-auto (`proceed` switches the mode and returns the
  follow-up task, prompts/plan_approved.md, which the front end sends like any
  task, so the plan already in the conversation is carried out), or stay in
  plan mode and type what to change in the plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import prompts
from tools import ApprovalMode

PLAN_INSTRUCTION_PROMPT = "plan_mode"
PLAN_APPROVED_PROMPT = "plan_approved"


@dataclass(frozen=True)
class PlanChoice:
    """One answer to "carry out this plan?": the mode to carry it out in, or PLAN to
    keep planning."""

    mode: ApprovalMode

    @property
    def proceeds(self) -> bool:
        return self.mode is not ApprovalMode.PLAN

    @property
    def label(self) -> str:
        return self.mode.label if self.proceeds else "Keep planning"

    @property
    def description(self) -> str:
        if self.proceeds:
            return self.mode.description
        return "Stays in plan mode; say what to change in the plan."


# In the order front ends offer them (keys 1-4 in the TUI and the REPL).
PLAN_CHOICES: tuple[PlanChoice, ...] = tuple(
    PlanChoice(mode)
    for mode in (
        ApprovalMode.ASK,
        ApprovalMode.AUTO_EDIT,
        ApprovalMode.FULL_AUTO,
        ApprovalMode.PLAN,
    )
)
# The modes a plan can be carried out in: the choices that proceed.
PROCEED_MODES: tuple[ApprovalMode, ...] = tuple(c.mode for c in PLAN_CHOICES if c.proceeds)


class ModeHolder(Protocol):
    """What `proceed` needs of the agent (agent.core.loop.Agent): its approval mode."""

    approval_mode: ApprovalMode


def task_for_model(task: str, mode: ApprovalMode) -> str:
    """The user's message as the model receives it: in plan mode, the task followed by
    the plan-mode instruction; in any other mode, the task unchanged."""
    if mode is not ApprovalMode.PLAN:
        return task
    return f"{task.rstrip()}\n\n{prompts.load(PLAN_INSTRUCTION_PROMPT).rstrip()}"


def proposes_plan(
    started_in: ApprovalMode, ended_in: ApprovalMode, reason: str, answer: str
) -> bool:
    """Whether a task's answer is a plan: it ran in plan mode from start to end (a
    switch in between means the model was not, or no longer, only planning) and
    ended with a non-empty answer (reason "done")."""
    planning = started_in is ApprovalMode.PLAN and ended_in is ApprovalMode.PLAN
    return planning and reason == "done" and bool(answer.strip())


def proceed(agent: ModeHolder, mode: ApprovalMode) -> str:
    """Carry out the proposed plan in `mode`: the agent's approval mode is switched, and
    the task returned is what the front end sends next (the plan itself is already in
    the conversation). ValueError for a mode that cannot carry anything out."""
    if mode not in PROCEED_MODES:
        modes = ", ".join(m.value for m in PROCEED_MODES)
        raise ValueError(f"a plan is carried out in {modes}, not in {mode.value}")
    agent.approval_mode = mode
    return prompts.load(PLAN_APPROVED_PROMPT).rstrip()
