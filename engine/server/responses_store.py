"""Recent responses kept in memory, so `previous_response_id` chains within one server process.

Each entry holds only what its request added (its new input items and its
output items) and the id of the response it continued; a chain's history is
rebuilt by walking those links. That keeps memory linear in the conversation,
where storing every response's whole history would grow with its square.
Walking a chain refreshes every link, so only chains nobody continues age
out. Bounded by count and by the size of the stored items; nothing is
written to disk, and a restart forgets everything (clients then get a 404
naming the id and send the whole input instead, as Codex does anyway with
`store: false`).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from engine.server.error_responses import APIError

MAX_RESPONSES = 1024
MAX_STORED_CHARS = 64 * 1024 * 1024


@dataclass
class StoredResponse:
    response: dict[str, Any]
    items: list[dict[str, Any]]  # this request's input items, then its output items
    previous_id: str | None
    size: int


def _not_found(response_id: str, param: str | None, why: str = "") -> APIError:
    return APIError(
        404,
        f"no response with id {response_id!r} is stored on this server{why}",
        type="invalid_request_error",
        param=param,
        code="previous_response_not_found" if param else "response_not_found",
    )


class ResponseStore:
    def __init__(self, max_responses: int = MAX_RESPONSES, max_chars: int = MAX_STORED_CHARS):
        self.max_responses = max_responses
        self.max_chars = max_chars
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._chars = 0

    def put(
        self,
        response: dict[str, Any],
        input_items: list[dict[str, Any]],
        previous_id: str | None,
    ) -> None:
        items = [*input_items, *response["output"]]
        size = len(json.dumps(items, ensure_ascii=False))
        if size > self.max_chars:
            return  # larger than the whole store: keeping it would evict everything else
        self.delete(response["id"])
        self._entries[response["id"]] = StoredResponse(response, items, previous_id, size)
        self._chars += size
        while len(self._entries) > self.max_responses or self._chars > self.max_chars:
            _, evicted = self._entries.popitem(last=False)
            self._chars -= evicted.size

    def get(self, response_id: str) -> dict[str, Any]:
        entry = self._entries.get(response_id)
        if entry is None:
            raise _not_found(response_id, None)
        self._entries.move_to_end(response_id)
        return entry.response

    def delete(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is not None:
            self._chars -= entry.size
        return entry is not None

    def history(self, response_id: str) -> list[dict[str, Any]]:
        """Every item of the chain ending at `response_id`, oldest first."""
        chain: list[StoredResponse] = []
        current: str | None = response_id
        while current is not None:
            entry = self._entries.get(current)
            if entry is None:
                why = "" if current == response_id else f" (its ancestor {current!r} has aged out)"
                raise _not_found(response_id, "previous_response_id", why)
            self._entries.move_to_end(current)
            chain.append(entry)
            current = entry.previous_id
        return [item for entry in reversed(chain) for item in entry.items]
