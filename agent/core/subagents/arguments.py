"""What the model sends the `task` tool: a description for the user and the task itself."""

from __future__ import annotations

from pydantic import Field

from tools import Arguments

DESCRIPTION_MAX_CHARS = 80
PROMPT_MAX_CHARS = 20_000


class TaskArgs(Arguments):
    description: str = Field(
        min_length=1,
        max_length=DESCRIPTION_MAX_CHARS,
        description="3 to 8 words for the user.",
    )
    prompt: str = Field(
        min_length=1,
        max_length=PROMPT_MAX_CHARS,
        description="The whole task and what to report back.",
    )
    write: bool = Field(
        default=False,
        description="Let it edit files and run commands; false (research) runs read-only.",
    )
