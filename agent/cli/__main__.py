"""`python -m agent.cli`: the `resident` command."""

from agent.cli import app

app()
