"""Errors the engine raises on bad input, each with a message that names the fix."""


class EngineError(Exception):
    """Base class for errors caused by the caller's input or configuration."""


class UnsupportedModelError(EngineError):
    """The checkpoint's architecture or format is not one the engine implements."""


class ModelError(EngineError):
    """A model that cannot be found, fetched or read (engine/model_files); the message
    names the fix."""


class CheckpointError(EngineError):
    """The checkpoint is incomplete or corrupt (a missing shard, a missing tensor)."""


class PromptTooLongError(EngineError):
    """A request's prompt plus its output budget does not fit the context."""


class KVCapacityError(EngineError):
    """The KV memory budget cannot hold what was asked of it."""


class EngineOverloadedError(EngineError):
    """The waiting queue is full; the caller should retry later."""


class WorkerDiedError(EngineError):
    """A tensor-parallel rank has died (or the ranks fell out of step): the engine cannot
    run another step, and every pending and new request fails with this until the
    engine is restarted. `failure` says what happened (which rank, how)."""

    def __init__(self, failure: str, advice: str | None = "restart it"):
        message = f"the tensor-parallel engine has failed: {failure}"
        super().__init__(f"{message}; {advice}" if advice else message)
        self.failure = failure
