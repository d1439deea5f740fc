"""The chat template K gives llama-server where the model's own has no tools: chatapp's way of teaching them.

A GGUF whose template renders no tools (the PyPI Gemma 3 270M has none at all; SmolLM2's has
no tools) is taught Hermes' format by chatapp, in the system prompt, its calls and results
written as `<tool_call>` and `<tool_response>` blocks (prompting/tool_blocks.py). llama-server,
given such a model, drops the tools and every call from the prompt and answers in text: a
shorter prompt and no tool work, so K would compare unlike things. Given this template
(`--chat-template-file`), it teaches the same format in the same words (ChatML around it, as
chatapp's fallback), finds the calls in it and answers with them: both servers then compute
nearly the same prompt and both call tools.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from chatapp.prompting.chat_template import ChatTemplate
from chatapp.prompting.prompt import PromptBuilder
from chatapp.prompting.tool_blocks import (
    CALL_CLOSE,
    CALL_OPEN,
    RESULT_CLOSE,
    RESULT_OPEN,
    TEACHING_AFTER_SCHEMAS,
    TEACHING_BEFORE_SCHEMAS,
)

if TYPE_CHECKING:
    from chatapp.benchmark.workloads import Request


def _text(value: str) -> str:
    """`value` as a Jinja expression that prints it."""
    return "{{- " + json.dumps(value, ensure_ascii=False) + " }}"


HERMES_CHATML_TEMPLATE = "".join(
    [
        "{%- if tools %}",
        _text("<|im_start|>system\n"),
        "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}",
        _text(TEACHING_BEFORE_SCHEMAS),
        "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}",
        _text("\n" + TEACHING_AFTER_SCHEMAS + "<|im_end|>\n"),
        "{%- elif messages[0].role == 'system' %}",
        "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}",
        "{%- endif %}",
        "{%- for message in messages %}",
        "{%- if message.role == 'user' or (message.role == 'assistant' and not message.tool_calls) %}",
        "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}",
        "{%- elif message.role == 'assistant' %}",
        "{{- '<|im_start|>assistant\\n' }}",
        "{%- if message.content %}{{- message.content + '\\n' }}{%- endif %}",
        "{%- for call in message.tool_calls %}",
        "{%- if call.function is defined %}{%- set call = call.function %}{%- endif %}",
        "{%- if not loop.first %}{{- '\\n' }}{%- endif %}",
        _text(CALL_OPEN + '\n{"name": '),
        "{{- call.name | tojson }}",
        _text(', "arguments": '),
        "{%- if call.arguments is string %}{{- call.arguments }}{%- else %}{{- call.arguments | tojson }}{%- endif %}",
        _text("}\n" + CALL_CLOSE),
        "{%- endfor %}",
        "{{- '<|im_end|>\\n' }}",
        "{%- elif message.role == 'tool' %}",
        "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user\\n' }}"
        "{%- else %}{{- '\\n' }}{%- endif %}",
        _text(RESULT_OPEN + "\n"),
        "{{- message.content }}",
        _text("\n" + RESULT_CLOSE),
        "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}",
        "{%- endif %}",
        "{%- endfor %}",
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}",
    ]
)


def server_template_for(builder: PromptBuilder, requests: Sequence[Request]) -> str | None:
    """The template a server is given for `requests` so that it writes their prompts as `builder` does: None
    where the model's own template renders the tools (the server keeps it), or where this one would write
    other text (a model whose turns are not ChatML's); the longest request holds every message."""
    if builder.native_tools or not requests:
        return None
    longest = max(requests, key=lambda request: len(request.tokens))
    own = builder.template
    teaching = PromptBuilder(ChatTemplate(HERMES_CHATML_TEMPLATE, own.bos_token, own.eos_token), builder.tokenizer)
    written = teaching.with_tools(longest.tools).build(list(longest.messages))
    # The same text (the tokens may split otherwise where chatapp tokenizes message by message).
    same = builder.detokenize(written) == builder.detokenize(list(longest.tokens))
    return HERMES_CHATML_TEMPLATE if same else None
