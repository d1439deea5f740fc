"""Which tool-call format a model's chat template speaks, found once when its prompt builder is made."""

from __future__ import annotations

from chatapp.prompting.harmony import speaks_harmony
from chatapp.prompting.tool_blocks import CALL_OPEN, HERMES, XML
from chatapp.prompting.tool_formats import ToolFormat
from chatapp.prompting.tool_harmony import HARMONY
from chatapp.prompting.tool_llama import LLAMA_JSON
from chatapp.prompting.tool_mistral import ARGS, CALL_ID, MISTRAL_ARGS, MISTRAL_ARGS_WITH_IDS, MISTRAL_JSON, TOOL_CALLS
from chatapp.tools import ToolSpec

PROBE_TOOL = ToolSpec("chatapp_probe_function", "probe", '{"type":"object","properties":{}}')


def native_format(template_source: str, renders_tools: bool) -> ToolFormat | None:
    """The template's own call format when it is one we parse; None: teach Hermes in the system prompt.

    `renders_tools`: the template shows the model the tools it is given (PROBE_TOOL's name).
    """
    if not renders_tools:
        return None
    if CALL_OPEN in template_source:
        return XML if "<function=" in template_source else HERMES
    if "ipython" in template_source and '"parameters"' in template_source:
        return LLAMA_JSON  # Llama 3.1-3.3: a bare JSON object, results in the ipython role
    if TOOL_CALLS in template_source:  # Mistral's: `[TOOL_CALLS]name[ARGS]` from tokenizer v11 on, JSON before
        if ARGS not in template_source:
            return MISTRAL_JSON
        return MISTRAL_ARGS_WITH_IDS if CALL_ID in template_source else MISTRAL_ARGS
    if speaks_harmony(template_source):
        return HARMONY  # gpt-oss: a message to functions.NAME on the commentary channel
    return None
