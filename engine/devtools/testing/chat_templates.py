"""Chat templates for the tiny checkpoints, each in its family's real format.

Compact rewrites, not copies, of what the real checkpoints ship; they write
the same markers in the same places, which is what the engine's tool-call and
reasoning parsers (engine/chat) and the server depend on:

- ChatML (Qwen2 style) for the Llama/Qwen2/GLM-4 dense test models.
- Kimi K2 / K2-Thinking: `<|im_system|>tool_declare<|im_middle|>` with the
  tools as compact JSON; roles as `<|im_user|>user<|im_middle|>...<|im_end|>`;
  reasoning as `<think>...</think>` at the start of assistant turns after the
  last user message (earlier turns get an empty `<think></think>`); calls as
  a `<|tool_calls_section_begin|>` section whose ids are `functions.NAME:IDX`;
  results as `## Return of ID`.
- GLM-4.5/4.6: `[gMASK]<sop>`, `<|system|>`/`<|user|>`/`<|assistant|>`/
  `<|observation|>` turns, tools declared as JSON lines in `<tools>`, calls as
  `<tool_call>NAME` with a newline before each `<arg_key>`/`<arg_value>`
  pair (GLM-4.7 drops those newlines), and `<think></think>` after
  `<|assistant|>`. `enable_thinking=False` appends `/nothink` to user turns.

Written with `{%-`/`-%}` throughout so every newline in the output is an
explicit `'\\n'`: the layout is exact under transformers' trim_blocks and
lstrip_blocks.
"""

from __future__ import annotations

CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_KIMI_CONTENT_MACRO = (
    "{%- macro content_text(content) -%}"
    "{%- if content is string -%}{{- content -}}"
    "{%- elif content is iterable and content is not mapping -%}"
    "{%- for part in content -%}"
    "{%- if part is mapping and part.type == 'text' -%}{{- part.text -}}"
    "{%- elif part is string -%}{{- part -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{%- endmacro -%}"
)

KIMI_K2_TEMPLATE = (
    _KIMI_CONTENT_MACRO + "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if tools -%}"
    "<|im_system|>tool_declare<|im_middle|>{{- tools | tojson(separators=(',', ':')) -}}<|im_end|>"
    "{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if loop.first and m.role != 'system' -%}"
    "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>"
    "{%- endif -%}"
    "{%- if m.role == 'system' -%}"
    "<|im_system|>system<|im_middle|>{{- content_text(m.content) -}}<|im_end|>"
    "{%- elif m.role == 'user' -%}"
    "<|im_user|>user<|im_middle|>{{- content_text(m.content) -}}<|im_end|>"
    "{%- elif m.role == 'assistant' -%}"
    "<|im_assistant|>assistant<|im_middle|>"
    "{%- if loop.index0 > ns.last_user and m.reasoning_content is defined -%}"
    "<think>{{- m.reasoning_content -}}</think>"
    "{%- else -%}<think></think>{%- endif -%}"
    "{{- content_text(m.content) -}}"
    "{%- if m.tool_calls -%}"
    "<|tool_calls_section_begin|>"
    "{%- for call in m.tool_calls -%}"
    "<|tool_call_begin|>{{- call.id -}}<|tool_call_argument_begin|>"
    "{%- if call.function.arguments is string -%}{{- call.function.arguments -}}"
    "{%- else -%}{{- call.function.arguments | tojson -}}{%- endif -%}"
    "<|tool_call_end|>"
    "{%- endfor -%}"
    "<|tool_calls_section_end|>"
    "{%- endif -%}"
    "<|im_end|>"
    "{%- elif m.role == 'tool' -%}"
    "<|im_system|>tool<|im_middle|>## Return of {{ m.tool_call_id }}{{- '\\n' -}}"
    "{{- content_text(m.content) -}}<|im_end|>"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "<|im_assistant|>assistant<|im_middle|>"
    "{%- if thinking is defined and not thinking -%}<think></think>{%- endif -%}"
    "{%- endif -%}"
)

_GLM_TOOLS_PREAMBLE = (
    "\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>\\n"
)
_GLM_CALL_FORMAT = (
    "</tools>\\n\\nFor each function call, output the function name and arguments within "
    "the following XML format:\\n<tool_call>{function-name}\\n<arg_key>{arg-key-1}</arg_key>\\n"
    "<arg_value>{arg-value-1}</arg_value>\\n...\\n</tool_call>"
)

GLM45_TEMPLATE = (
    "[gMASK]<sop>"
    "{%- if tools -%}"
    "<|system|>{{- '" + _GLM_TOOLS_PREAMBLE + "' -}}"
    "{%- for tool in tools -%}{{- tool | tojson(ensure_ascii=False) -}}{{- '\\n' -}}{%- endfor -%}"
    "{{- '" + _GLM_CALL_FORMAT + "' -}}"
    "{%- endif -%}"
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}"
    "{%- endif -%}{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- set text = m.content if m.content is string else '' -%}"
    "{%- if m.role == 'system' -%}<|system|>{{- '\\n' + text -}}"
    "{%- elif m.role == 'user' -%}<|user|>{{- '\\n' + text -}}"
    "{%- if enable_thinking is defined and not enable_thinking -%}/nothink{%- endif -%}"
    "{%- elif m.role == 'assistant' -%}<|assistant|>"
    "{%- if loop.index0 > ns.last_user and m.reasoning_content -%}"
    "{{- '\\n<think>' + m.reasoning_content.strip() + '</think>' -}}"
    "{%- else -%}{{- '\\n<think></think>' -}}{%- endif -%}"
    "{%- if text.strip() -%}{{- '\\n' + text.strip() -}}{%- endif -%}"
    "{%- for call in m.tool_calls or [] -%}"
    "{%- set call = call.function if call.function is defined else call -%}"
    "{{- '\\n<tool_call>' + call.name -}}"
    "{%- for key, value in (call.arguments or {}).items() -%}"
    "{{- '\\n<arg_key>' + key + '</arg_key>\\n<arg_value>' -}}"
    "{{- value if value is string else value | tojson(ensure_ascii=False) -}}"
    "{{- '</arg_value>' -}}"
    "{%- endfor -%}"
    "{{- '\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{%- elif m.role == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}<|observation|>{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + text + '\\n</tool_response>' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>"
    "{%- if enable_thinking is defined and not enable_thinking -%}{{- '\\n<think></think>' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
)
