"""The request bodies the server accepts, as pydantic models.

Field names and defaults follow OpenAI's API; the few extensions (`top_k`,
`min_p`, `repetition_penalty`, `cache_salt`, `ignore_eos`, ...) are the ones
vLLM and SGLang also accept, so clients written for them work here. Unknown
fields are ignored, as OpenAI clients send fields we have no use for.
Range checks live here so that a bad value is a 400 naming the parameter:
every number must be finite (the body reader already refuses NaN, Infinity
and 1e400 anywhere; these hold for requests built in code too) and in a
range the engine can use (SEED_RANGE, TOKEN_ID_RANGE, ...).
Responses are plain dicts built where they are produced (see
chat_completions.py and completions.py).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# How many choices one request may ask for (`n`); each is a full engine request.
MAX_CHOICES = 16
# Top alternatives per token; the engine computes at most this many.
MAX_TOP_LOGPROBS = 20
# Seeds are 64-bit, as vLLM takes them; choice i of n samples with seed + i, which
# torch's generator still takes (it reads seeds up to 2**64 - 1).
SEED_RANGE = (-(2**63), 2**63 - 1)
# Token ids and top_k are 32-bit wherever they meet a tensor or the grammar engine.
TOKEN_ID_RANGE = (0, 2**31 - 1)
TokenId = Annotated[int, Field(ge=TOKEN_ID_RANGE[0], le=TOKEN_ID_RANGE[1])]


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Lenient):
    include_usage: bool = False


class FunctionDefinition(_Lenient):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolDefinition(_Lenient):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(_Lenient):
    name: str


class NamedToolChoice(_Lenient):
    type: Literal["function"] = "function"
    function: NamedFunction


class JsonSchemaFormat(_Lenient):
    """`response_format.json_schema`: the schema the answer must validate against."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    # `schema` would shadow BaseModel.schema; the JSON field keeps its OpenAI name.
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Lenient):
    """`text` (no constraint), `json_object` (any JSON object) or `json_schema`.

    Both JSON types are enforced by constrained decoding (engine.grammar), with
    or without `strict`: a schema is never merely a hint here.
    """

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self):
        if self.type == "json_schema" and (
            self.json_schema is None or self.json_schema.schema_ is None
        ):
            raise ValueError("json_schema.schema is required when type is json_schema")
        return self


class ChatMessage(BaseModel):
    # Extra keys (e.g. `reasoning_content`, `name`) are passed on to the chat template.
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class SamplingFields(_Lenient):
    """What chat and completions requests share."""

    model: str | None = None
    n: int = Field(default=1, ge=1, le=MAX_CHOICES)
    stream: bool = False
    stream_options: StreamOptions | None = None
    # OpenAI's ranges; repetition_penalty's is SGLang's (above 2 it only wrecks the text,
    # and a huge one turns every logit infinite).
    temperature: float = Field(default=1.0, ge=0, le=2, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0, le=1, allow_inf_nan=False)
    top_k: int = Field(default=0, ge=-1, le=TOKEN_ID_RANGE[1])
    min_p: float = Field(default=0.0, ge=0, le=1, allow_inf_nan=False)
    seed: int | None = Field(default=None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    stop: str | list[str] | None = None
    stop_token_ids: list[TokenId] | None = None
    presence_penalty: float = Field(default=0.0, ge=-2, le=2, allow_inf_nan=False)
    frequency_penalty: float = Field(default=0.0, ge=-2, le=2, allow_inf_nan=False)
    repetition_penalty: float = Field(default=1.0, gt=0, le=2, allow_inf_nan=False)
    logit_bias: dict[str, float] | None = None
    ignore_eos: bool = False
    speculative: bool | None = None  # prompt-lookup speculation; None: the server's default
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool | None = None  # None: the server decides (see chat_rendering)
    cache_salt: str | None = Field(default=None, max_length=256)
    user: str | None = None

    @model_validator(mode="after")
    def _reject_unsupported(self):
        if self.logit_bias:
            raise ValueError("logit_bias is not supported by this server")
        return self


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[ToolDefinition] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None
    # Extensions for agents: render the template's own options (e.g. enable_thinking),
    # or continue the last assistant message instead of starting a new one.
    chat_template_kwargs: dict[str, Any] | None = None
    continue_final_message: bool = False

    @model_validator(mode="after")
    def _check_chat(self):
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs=true")
        if self.continue_final_message and self.messages[-1].role != "assistant":
            raise ValueError("continue_final_message needs an assistant message last")
        return self

    @property
    def output_budget(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


PromptInput = str | list[str] | list[int] | list[list[int]]


class CompletionRequest(SamplingFields):
    prompt: PromptInput
    max_tokens: int = Field(default=16, ge=1)
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _check_completion(self):
        if self.suffix:
            raise ValueError("suffix is not supported by this server")
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("best_of other than n is not supported by this server")
        if isinstance(self.prompt, list) and not self.prompt:
            raise ValueError("prompt is empty")
        return self

    def prompts(self) -> list[str | list[int]]:
        """The prompt as a list of single prompts (a string or token ids each)."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if all(isinstance(item, int) for item in prompt):
            return [list(prompt)]
        return list(prompt)
