"""MCP tools as Resident tools, without a server: names, schemas, results, epochs.
(How the approval policy judges them: tests/tools/test_permissions.py.)"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import mcp_types as types

from agent.core.mcp.catalog import ToolCatalog
from agent.core.mcp.connection import _offer
from agent.core.mcp.names import MAX_NAME, server_prefix, tool_name
from agent.core.mcp.results import convert
from agent.core.mcp.status import OfferedTool, ServerStatus, State
from agent.core.mcp.tool import McpTool
from tools import Registry, default_tools
from tools.base import ToolAccess

SCHEMA = {
    "type": "object",
    "title": "echoArguments",
    "properties": {"text": {"title": "Text", "type": "string"}},
    "required": ["text"],
}


def offered(name: str = "echo", server: str = "demo", schema=SCHEMA) -> OfferedTool:
    return OfferedTool(tool_name(server, name), server, name, f"The {name} tool.", schema)


def test_names_are_namespaced_cleaned_and_capped():
    assert tool_name("demo", "echo") == "mcp__demo__echo"
    assert tool_name("my server.io", "get/file") == "mcp__my_server_io__get_file"
    assert server_prefix("a__b___c") == "mcp__a_b_c"  # `__` only separates the parts
    long_a, long_b = tool_name("s", "x" * 80 + "a"), tool_name("s", "x" * 80 + "b")
    assert len(long_a) == MAX_NAME and len(long_b) == MAX_NAME and long_a != long_b


def test_colliding_names_are_skipped_with_the_reason():
    tools = [
        types.Tool(name=n, input_schema={"type": "object"}) for n in ("get.file", "get_file", "ok")
    ]
    kept, skipped = _offer("demo", tools, reserved={"mcp__demo__ok"})
    assert [t.name for t in kept] == ["mcp__demo__get_file"]
    assert kept[0].original == "get.file"
    assert skipped == (
        "get_file: named mcp__demo__get_file like 'get.file'",
        "ok: its name mcp__demo__ok is a built-in tool's",
    )


def test_the_schema_the_model_sees_and_argument_checks():
    tool = McpTool(offered(), manager=None)  # type: ignore[arg-type]
    function = tool.schema()["function"]
    assert function["name"] == "mcp__demo__echo"
    assert function["description"] == "[MCP server demo] The echo tool."
    assert function["parameters"] == {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
    }
    registry = Registry([tool])
    call = registry.parse("mcp__demo__echo", '{"text": "hi"}')
    assert call.args.model_dump() == {"text": "hi"}
    assert call.access == ToolAccess(
        effect=tool.effect, summary='MCP server demo: echo {"text": "hi"}', external=True
    )
    missing = registry.parse("mcp__demo__echo", "{}")
    assert "- (arguments): 'text' is a required property (got {})" in missing.output
    assert 'Expected {"text": string}' in missing.output


def test_a_broken_schema_leaves_checking_to_the_server():
    tool = McpTool(offered(schema={"type": "object", "properties": 3}), manager=None)  # type: ignore[arg-type]
    call = Registry([tool]).parse(tool.name, {"anything": [1]})
    assert call.args.model_dump() == {"anything": [1]}


def test_results_text_images_and_errors():
    image = types.ImageContent(data="A" * 4096, mime_type="image/png")
    result = types.CallToolResult(content=[types.TextContent(text="one"), image])
    converted = convert(result, 1000)
    assert converted.ok and converted.output == "one\n[image: image/png, 3 KB]"
    error = convert(types.CallToolResult(content=[types.TextContent(text="no")], is_error=True), 99)
    assert not error.ok and error.output == "no"
    structured = convert(types.CallToolResult(content=[], structured_content={"n": 1}), 99)
    assert structured.output == '{\n "n": 1\n}'
    assert convert(types.CallToolResult(content=[]), 99).output == "(the tool returned no content)"
    long = convert(types.CallToolResult(content=[types.TextContent(text="x" * 5000)]), 1000)
    assert long.truncated and "bytes omitted" in long.output and len(long.output) < 1200


class FakeManager:
    def __init__(self, statuses: list[ServerStatus]) -> None:
        self._statuses = statuses
        self.version = 0
        self.started_at = None

    def statuses(self):
        return self._statuses

    def starting(self):
        return False


def status(name: str, state: State, *tools: OfferedTool) -> ServerStatus:
    return ServerStatus(name, "stdio", "user", "cmd", "none", state=state, tools=tools)


def test_the_catalog_changes_the_tools_only_at_an_epoch():
    builtins = Registry(default_tools())
    echo, add = offered("echo"), offered("add")
    manager = FakeManager([status("demo", State.STARTING)])
    catalog = ToolCatalog(builtins, manager)  # type: ignore[arg-type]
    first = catalog.schemas()
    assert [s["function"]["name"] for s in first] == builtins.names()
    manager._statuses = [status("demo", State.READY, add, echo)]
    manager.version = 1  # what the context compares to start a new epoch
    names = [s["function"]["name"] for s in catalog.schemas()]
    assert names == sorted(names) and {"mcp__demo__add", "mcp__demo__echo"} <= set(names)
    assert catalog.offered() == ["mcp__demo__add", "mcp__demo__echo"]
    manager._statuses = [replace(manager._statuses[0], state=State.FAILED)]
    assert "mcp__demo__echo" in builtins  # until the next epoch
    catalog.schemas()
    assert "mcp__demo__echo" not in builtins and catalog.offered() == []
    asyncio.run(catalog.settle())  # nothing starting: returns at once


def test_the_catalog_never_replaces_a_tool_already_there():
    registry = Registry(default_tools())
    clash = OfferedTool("read", "demo", "read", "A clash.", SCHEMA)
    catalog = ToolCatalog(registry, FakeManager([status("demo", State.READY, clash)]))  # type: ignore[arg-type]
    catalog.schemas()
    assert registry.get("read").__class__.__name__ == "ReadTool" and catalog.offered() == []


def test_what_slash_mcp_and_mcp_list_print(tmp_path):
    from agent.core.mcp.config import ConfigProblem
    from agent.core.mcp.report import status_lines

    ready = replace(
        status("demo", State.READY, offered("echo"), offered("add")), skipped=("x: clash",)
    )
    failed = replace(status("web", State.FAILED), transport="http", reason="did not start in 1s")
    problem = ConfigProblem(tmp_path / "mcp.json", "mcpServers.typo.comand: unknown field", "typo")
    lines = status_lines([ready, failed], [problem])
    assert lines[0] == "demo  stdio  ready  2 tools"
    assert lines[1] == "    cmd  (user; sandbox: none)"
    assert "    mcp__demo__echo  The echo tool." in lines
    assert "    skipped: x: clash" in lines
    assert "web  http  failed" in lines and "    reason: did not start in 1s" in lines
    assert (
        lines[-1] == f"config error: {tmp_path / 'mcp.json'}: mcpServers.typo.comand: unknown field"
    )
    assert "mcp__demo__echo  The echo tool." not in "\n".join(
        status_lines([ready], [], tools=False)
    )
    assert status_lines([], [])[0].startswith("No MCP servers configured.")
