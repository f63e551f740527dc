"""What every route handler needs: the engine, the model it serves, metrics, the API key."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from engine.server.auth import cache_salt
from engine.server.error_responses import APIError
from engine.server.metrics import ServerMetrics
from engine.server.served_model import ServedModel
from engine.server.serving_engine import ServingEngine


@dataclass
class ServerContext:
    engine: ServingEngine  # AsyncEngine, or a test's double with the same generate/stats
    model: ServedModel
    metrics: ServerMetrics
    api_key: str | None = None

    def check_model(self, name: str | None) -> None:
        if not self.model.accepts(name):
            raise APIError(
                404,
                f"the model {name!r} does not exist; this server serves {self.model.id!r}",
                type="not_found_error",
                param="model",
                code="model_not_found",
            )

    def cache_salt(self, requested: str | None) -> str:
        return cache_salt(self.api_key, requested)


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"
