"""`python -m engine`: the engine's own commands (engine/cli)."""

from engine.cli import engine_app

engine_app()
