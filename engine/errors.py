"""Errors the engine raises on bad input, each with a message that names the fix."""


class EngineError(Exception):
    """Base class for errors caused by the caller's input or configuration."""


class UnsupportedModelError(EngineError):
    """The checkpoint's architecture or format is not one the engine implements."""


class CheckpointError(EngineError):
    """The checkpoint is incomplete or corrupt (a missing shard, a missing tensor)."""


class PromptTooLongError(EngineError):
    """A request's prompt plus its output budget does not fit the context."""


class KVCapacityError(EngineError):
    """The KV memory budget cannot hold what was asked of it."""


class EngineOverloadedError(EngineError):
    """The waiting queue is full; the caller should retry later."""
