"""An agent loop through the official `openai` client against chatapp serve, on the bundled model.

Each question is answered with a required tool call, its result sent back, then up to two more
steps with tool_choice auto (text, or text and a further call: both are sent back, as clients do; the
tool's run and the user's typing give the engine time to put the last answer's tokens in the KV:
`flush_cache`, as the time between requests does); the server restarts (same data folder) before
the last question. Prints, per request, the prompt tokens and the share reused. Run from the repository root:

    .venv/bin/python tools/agent_loop_reuse.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import openai

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from chatapp.model_files import bundled_model_path
from tests.server_support import RunningServer, running_server

SYSTEM = "You are a coding agent working in a repository. " * 20
FUNCTIONS = [
    ("read_file", "Read a file of the project and return its text.", "path"),
    ("list_dir", "List the files in a folder.", "path"),
    ("search", "Search the project for a text.", "query"),
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": {field: {"type": "string"}}, "required": [field]},
        },
    }
    for name, description, field in FUNCTIONS
]
RUNS = [["Where is the config read?", "Which tests cover it?"], ["And after a restart, where are settings saved?"]]


def ask(server: RunningServer, messages: list[dict[str, Any]], question: str) -> list[tuple[str, int, int]]:
    """One question: a required call, its result, then the answer; (label, prompt, reused) per request."""
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    messages.append({"role": "user", "content": question})
    rows = []
    for step, choice in enumerate(["required", "auto", "auto"]):
        answer = client.chat.completions.create(
            model=server.model_id, messages=messages, tools=TOOLS, tool_choice=choice, temperature=0, max_tokens=60
        )
        usage = answer.usage
        assert usage is not None
        assert usage.prompt_tokens_details is not None
        label = f"{question[:30]} ({'call' if step == 0 else f'after result {step}'})"
        rows.append((label, usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens or 0))
        message = answer.choices[0].message
        if not message.tool_calls:
            messages.append({"role": "assistant", "content": message.content})
            server.serving.engine.flush_cache()  # the user reads and types: the answer's tokens reach the KV
            break
        calls = [call.model_dump(include={"id", "type", "function"}) for call in message.tool_calls]
        messages.append({"role": "assistant", "content": message.content, "tool_calls": calls})
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": f"(what {call.function.name} gave)"})
        server.serving.engine.flush_cache()  # the tool runs meanwhile: the call's tokens reach the KV
    return rows


def main() -> None:
    data = Path(tempfile.mkdtemp(prefix="agent-loop-"))
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for run, questions in enumerate(RUNS):
        if run:
            print("-- server restarted --")
        with running_server(data, bundled_model_path(), context_cap=4096) as server:
            for question in questions:
                for label, prompt, reused in ask(server, messages, question):
                    print(f"{label:50} prompt {prompt:5}  reused {reused:5}  {100 * reused / prompt:5.1f}%")


if __name__ == "__main__":
    main()
