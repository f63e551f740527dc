"""Running `resident run` in-process and reading its JSON events."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from typer.testing import CliRunner

from agent.cli import app


@dataclass
class RunResult:
    exit_code: int
    stdout: str
    stderr: str
    events: list[dict[str, Any]]

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == kind]

    def types(self) -> list[str]:
        return [e["type"] for e in self.events]

    @property
    def final(self) -> dict[str, Any]:
        return self.of_type("session_completed")[-1]


def run_cli(*args: str, input: str | None = None) -> RunResult:
    result = CliRunner().invoke(app, ["run", *args], input=input, catch_exceptions=False)
    events = []
    if "--json" in args:
        events = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    return RunResult(result.exit_code, result.stdout, result.stderr, events)


def attached(url: str, *extra: str) -> list[str]:
    return ["--attach", url, "--json", *extra]
