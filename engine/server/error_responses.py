"""OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}` with a 4xx/5xx status.

Every failure a request can cause ends here as JSON, so no bad request can
crash the server or leak a traceback: validation errors (and a request nested
too deeply to process) are 400, an unknown
model 404, a full queue 503 with Retry-After, a dead tensor-parallel rank 503, and
anything unexpected 500 (logged with its traceback, reported without it).
"""

from __future__ import annotations

import logging
import re
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine.errors import EngineError, EngineOverloadedError, WorkerDiedError

log = logging.getLogger(__name__)

# Seconds a client should wait before retrying when the waiting queue is full.
RETRY_AFTER_SECONDS = 1


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


class GenerationFailed(Exception):
    """The engine gave up on a request after accepting it (finish_reason "error")."""


class ClientDisconnected(Exception):
    """The client went away before its response was ready; nobody reads the answer."""


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


# Pydantic names the member of a union it tried (`str`, `list[int]`, `literal[...]`,
# a class name) in an error's location; our field names are all snake_case.
_UNION_TAG = re.compile(r"^(str|int|float|bool|[a-z_-]+\[.*\]|[A-Z]\w*)$")


def from_validation_error(error: ValidationError | RequestValidationError) -> APIError:
    """The first problem pydantic found, named by its field path."""
    problems = error.errors()
    if not problems:
        return bad_request("invalid request body")
    first = problems[0]
    location = [
        str(part)
        for part in first.get("loc", ())
        if part != "body" and not (isinstance(part, str) and _UNION_TAG.match(part))
    ]
    param = ".".join(location) or None
    message = first.get("msg", "invalid value")
    if param:
        message = f"{param}: {message}"
    if len(problems) > 1:
        message += f" (and {len(problems) - 1} more problem(s))"
    return bad_request(message, param=param)


def from_exception(error: BaseException) -> APIError:
    """Map an exception raised while serving a request to the error the client sees."""
    if isinstance(error, APIError):
        return error
    if isinstance(error, EngineOverloadedError):
        return APIError(
            503,
            str(error),
            type="server_overloaded",
            code="overloaded",
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        )
    if isinstance(error, WorkerDiedError):
        return APIError(503, str(error), type="server_error", code="engine_failed")
    if isinstance(error, EngineError):
        return bad_request(str(error))
    if isinstance(error, ClientDisconnected):
        return APIError(499, "client closed the request", code="client_closed_request")
    if isinstance(error, GenerationFailed):
        return APIError(500, str(error), type="server_error", code="generation_failed")
    if isinstance(error, ValidationError):
        return from_validation_error(error)
    if isinstance(error, RecursionError):
        # Only what a request brings recurses without bound (JSON, schemas, templates
        # over them); the body reader bounds nesting, so this is a net behind it.
        log.warning("a request nested too deeply to be served", exc_info=error)
        return bad_request("the request nests too deeply to be processed; flatten it")
    log.error("request failed", exc_info=error)
    return APIError(500, "internal server error; see the server log", type="server_error")


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, error: APIError) -> JSONResponse:
        return error.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, error: RequestValidationError) -> JSONResponse:
        return from_validation_error(error).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, error: StarletteHTTPException) -> JSONResponse:
        try:
            phrase = HTTPStatus(error.status_code).phrase
        except ValueError:
            phrase = "error"
        message = error.detail if isinstance(error.detail, str) else phrase
        kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
        return APIError(error.status_code, message, type=kind).response()

    @app.exception_handler(ClientDisconnected)
    async def _gone(_: Request, error: ClientDisconnected) -> JSONResponse:
        return from_exception(error).response()

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, error: Exception) -> JSONResponse:
        return from_exception(error).response()
