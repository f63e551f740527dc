"""A chat completions request made into a prompt, through the engine's one chat renderer.

Everything about turning messages and tools into a prompt, and choosing how
the answer is read, lives in engine.rendering, shared with the agent's
in-process client and `LLM.chat`. What is left here is OpenAI's request
shape: `tool_choice` (which tools are offered at all), `chat_template_kwargs`,
`continue_final_message`, `skip_special_tokens`, and render errors as 400s.
Every tool's schema is checked to be a JSON Schema first, whatever
`tool_choice` says (engine.grammar.schema_shape), as OpenAI checks it.
Other chat APIs on this server map their requests onto the same renderer.
"""

from __future__ import annotations

from typing import Any

from engine.grammar import GrammarError
from engine.grammar.schema_shape import check_json_schema
from engine.rendering import ChatRenderer, ChatRenderError, NoChatTemplateError, RenderedChat
from engine.server.error_responses import bad_request
from engine.server.protocol import ChatCompletionRequest, NamedToolChoice
from engine.server.served_model import ServedModel

# The server's name for a rendered chat (kept for the modules that import it).
ChatPrompt = RenderedChat


def check_tool_schemas(schemas: list[tuple[str, Any]]) -> None:
    """A 400 naming the first (param, schema) pair whose schema is not a JSON Schema."""
    for param, schema in schemas:
        try:
            check_json_schema(schema, param)
        except GrammarError as error:
            raise bad_request(str(error), param=error.param) from error


def _active_tools(request: ChatCompletionRequest) -> list[dict[str, Any]]:
    choice = request.tool_choice
    tools = [tool.model_dump(exclude_none=True) for tool in request.tools or []]
    if choice == "none":
        return []
    if not tools:
        if choice == "required" or isinstance(choice, NamedToolChoice):
            raise bad_request("tool_choice asks for a tool call but no tools were given", "tools")
        return []
    if isinstance(choice, NamedToolChoice):
        named = [tool for tool in tools if tool["function"]["name"] == choice.function.name]
        if not named:
            raise bad_request(
                f"tool_choice names {choice.function.name!r}, which is not among the tools",
                param="tool_choice",
            )
        return named  # only the named tool is offered, which is the most we can enforce
    return tools


def renderer_for(model: ServedModel) -> ChatRenderer:
    """The model's renderer, or a 400 saying to use completions when it has no template."""
    try:
        return ChatRenderer(model.tokenizer, model.model_type, model.chat_template)
    except NoChatTemplateError:
        raise bad_request(
            "this model has no chat template; use /v1/completions", "messages"
        ) from None


def render_chat(
    request: ChatCompletionRequest, model: ServedModel, add_generation_prompt: bool = True
) -> ChatPrompt:
    """The prompt a chat request prefills (and, for /tokenize and the render endpoints,
    reports: engine/server/tokenize_routes.py). `add_generation_prompt` False (vLLM's
    /tokenize option) leaves the assistant's opening out."""
    renderer = renderer_for(model)
    check_tool_schemas(
        [
            (f"tools.{index}.function.parameters", tool.function.parameters)
            for index, tool in enumerate(request.tools or [])
            if tool.function.parameters is not None
        ]
    )
    tools = _active_tools(request)
    try:
        return renderer.render(
            [message.model_dump(exclude_none=True) for message in request.messages],
            tools,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=request.continue_final_message,
            template_kwargs=request.chat_template_kwargs,
            skip_special_tokens=request.skip_special_tokens,
        )
    except ChatRenderError as error:
        raise bad_request(str(error), param=error.param) from error
