"""Workload F's coding agent: its tools, as OpenCode or Cline sends them, its calls and their results.

Ten tools with JSON-schema parameters (read, write and edit files, list, glob and search the
tree, run a command, fetch a page, keep a to-do list, ask the user), each described as agents
describe theirs: a sentence of what it does, then usage notes grown from the bench's sentence
banks up to the scale's size. A client's history is a task, then one call per step with its
arguments and the tool's output: file lines, matches, test runs, all from fixed banks and
seeds, so every run and every peer sees the same prompts.

Only what the JSON schemas of a grammar hold is used (types, descriptions, enums, nested
objects and arrays; no numeric bounds), so a server that enforces the calls accepts the set.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from chatapp.tools import ToolCall, ToolResult, ToolSpec, arguments_json, compact_json


class TextMaker(Protocol):
    """What the agent's texts are grown with (workloads.TextMaker: sentence banks, sizes in tokens)."""

    tokenize: Callable[[str], list[int]]

    def grow(self, head: str, pieces: Iterator[str], target: int) -> str: ...

    def shuffled(
        self, rng: random.Random, head: str, bank: list[str], target: int, fill: Callable[[str], str] = str
    ) -> str: ...

    def rules(self, seed: int, target: int, bullet: str) -> str: ...


def _text(description: str) -> dict[str, Any]:
    return {"type": "string", "description": description}


def _integer(description: str) -> dict[str, Any]:
    return {"type": "integer", "description": description}


def _object(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


PATH = _text("The path, relative to the workspace root.")
TODO = _object(
    {
        "id": _text("A short identifier of the item."),
        "content": _text("What is to be done, in one line."),
        "status": {"type": "string", "enum": ["pending", "in_progress", "completed", "cancelled"]},
        "priority": {"type": "string", "enum": ["high", "medium", "low"]},
    },
    ["id", "content", "status", "priority"],
)

# (name, what it does, its parameters): the notes grown after the first sentence make up the rest.
TOOL_SET: tuple[tuple[str, str, dict[str, Any]], ...] = (
    (
        "read_file",
        "Read a file of the workspace; each line comes back with its number. For a long file, read it in parts "
        "with offset and limit.",
        _object(
            {
                "path": PATH,
                "offset": _integer("The line to start from (1-based); the beginning by default."),
                "limit": _integer("How many lines to read at most (default 2000)."),
            },
            ["path"],
        ),
    ),
    (
        "write_file",
        "Write a whole file, creating it or replacing what it holds. Read an existing file first; prefer "
        "edit_file for a change to part of it.",
        _object({"path": PATH, "content": _text("The file's new content, complete.")}, ["path", "content"]),
    ),
    (
        "edit_file",
        "Replace exact text in a file. old_string must occur once in the file unless replace_all is set; keep "
        "the indentation exactly as read_file showed it.",
        _object(
            {
                "path": PATH,
                "old_string": _text("The text to replace, exactly as it is in the file."),
                "new_string": _text("The text to put in its place (different from old_string)."),
                "replace_all": {"type": "boolean", "description": "Replace every occurrence (default false)."},
            },
            ["path", "old_string", "new_string"],
        ),
    ),
    (
        "list_dir",
        "List the files and folders in a folder, folders first, with their sizes.",
        _object(
            {
                "path": PATH,
                "ignore": {"type": "array", "items": {"type": "string"}, "description": "Glob patterns to leave out."},
            },
            ["path"],
        ),
    ),
    (
        "glob",
        "Find files whose path matches a glob pattern such as src/**/*.py, the most recently changed first.",
        _object(
            {"pattern": _text("The glob pattern to match."), "path": _text("The folder to search (default: root).")},
            ["pattern"],
        ),
    ),
    (
        "search",
        "Search file contents with a regular expression; each match comes back as path:line: text.",
        _object(
            {
                "pattern": _text("The regular expression to search for."),
                "path": _text("The folder to search (default: the workspace root)."),
                "include": _text("Only files whose name matches this glob, such as *.py."),
            },
            ["pattern"],
        ),
    ),
    (
        "run_command",
        "Run a shell command in the workspace and return its output and exit status. Say in a few words what "
        "it does; never run a command that waits for input.",
        _object(
            {
                "command": _text("The command line to run."),
                "description": _text("What the command does, in five to ten words."),
                "timeout_ms": _integer("Stop the command after this many milliseconds (default 120000)."),
            },
            ["command", "description"],
        ),
    ),
    (
        "web_fetch",
        "Fetch a web page and return its content in the format asked for.",
        _object(
            {
                "url": _text("The page's full URL."),
                "format": {"type": "string", "enum": ["text", "markdown", "html"], "description": "The format."},
            },
            ["url", "format"],
        ),
    ),
    (
        "todo_write",
        "Write the task's to-do list: the whole list each time, one item in progress at a time.",
        _object({"todos": {"type": "array", "items": TODO, "description": "The updated list."}}, ["todos"]),
    ),
    (
        "ask_followup_question",
        "Ask the user a question when the task cannot go on without an answer; offer the likely answers.",
        _object(
            {
                "question": _text("The question, clear and specific."),
                "options": {"type": "array", "items": {"type": "string"}, "description": "Two to five answers."},
            },
            ["question"],
        ),
    ),
)
# What an agent does, step after step: look around, read, change, check (each client starts elsewhere).
STEP_TOOLS = (
    "list_dir",
    "search",
    "read_file",
    "edit_file",
    "run_command",
    "todo_write",
    "glob",
    "read_file",
    "write_file",
    "run_command",
    "web_fetch",
    "ask_followup_question",
)
MODULES = ["billing", "shipping", "accounts", "reports", "payroll", "audit"]
NAMES = ["invoice", "parcel", "refund", "ticket", "supplier", "contract", "payment", "warehouse"]
FIELDS = ["total", "due_date", "currency", "status", "owner", "amount", "region", "reference"]
CODE_LINES = [
    "def {name}_{field}(record: dict[str, object]) -> object:",
    "    value = record.get({field!r})",
    "    if value is None:",
    '        raise ValueError("{name} {field} is missing")',
    "    total += row.{field} * {n}",
    "    return round(total, {k})",
    "class {Name}Report:",
    "    {field}: str = {field!r}",
    "from {module}.{name} import {name}_{field}",
    "    for row in rows[{k}:]:",
    "    assert {name}.{field} == {n}",
]
TASK_SENTENCES = [
    "The {name} {field} in src/{module}/{name}.py is wrong when the {field} is empty.",
    "Customers in {region} see the {name} {field} rounded to {k} decimals instead of two.",
    "The test tests/{module}/test_{name}.py fails since the last change to the {name} module.",
    "Keep the public functions of src/{module} as they are: other teams import them.",
    "The {name} report should list the {field} column after the reference, as the auditors asked.",
    "Add a test for the case the bug report describes, then make it pass.",
    "Do not touch the migrations folder; the database is shared with the {module} service.",
    "Run the {module} tests before you finish and tell me what you changed.",
]
REGIONS = ["Lyon", "Grenoble", "Marseille", "Lille"]
EDITS = [
    ("if value is None:", "if not value:"),
    ("return round(total, 3)", "return round(total, 2)"),
    ("rows[1:]", "rows"),
    ("currency = 'EUR'", "currency = record.currency"),
]


class AgentTexts:
    """The coding agent's texts, grown to sizes in tokens with the bench's `TextMaker`."""

    def __init__(self, texts: TextMaker) -> None:
        self.texts = texts

    def tools(self, seed: int, notes_tokens: int) -> tuple[ToolSpec, ...]:
        """The tool set; each description followed by about `notes_tokens` of usage notes (none at 0)."""
        specs = []
        for number, (name, description, parameters) in enumerate(TOOL_SET):
            if notes_tokens > 0:
                description += "\n\nUsage notes:\n" + self.texts.rules(seed * 100 + number, notes_tokens, "- ")
            specs.append(ToolSpec(name, description, compact_json(parameters)))
        return tuple(specs)

    def persona(self, seed: int, tokens: int) -> str:
        """The agent's system prompt (its tools come apart, in the request's `tools`)."""
        head = (
            f"You are coding agent A-{seed:03d}, working in the user's repository. Call one tool per step, read "
            "a file before you change it, and run the tests after a change.\n"
        )
        return (head + self.texts.rules(seed, tokens - len(self.texts.tokenize(head)), "- Rule: ")).rstrip("\n")

    def task(self, seed: int, tokens: int) -> str:
        """The user's task, the first message of a client's history."""
        rng = random.Random(60_000 + seed)
        head = f"Task T-{seed:04d}: "
        return self.texts.shuffled(rng, head, TASK_SENTENCES, tokens, lambda sentence: filled(rng, sentence)).rstrip()

    def call(self, client: int, number: int) -> ToolCall:
        """The call `client` makes at step `number`: to the tool the plan names there, with its arguments."""
        name = STEP_TOOLS[(3 * client + number) % len(STEP_TOOLS)]
        arguments = ARGUMENTS[name](self, random.Random(70_000 + 1000 * client + number))
        return ToolCall(f"call_c{client + 1}s{number + 1}", name, arguments_json(arguments))

    def result(self, client: int, number: int, call: ToolCall, tokens: int) -> ToolResult:
        """What the tool gave back for `call`: about `tokens` of output."""
        rng = random.Random(80_000 + 1000 * client + number)
        return ToolResult(call.id, call.name, OUTPUTS[call.name](self, rng, call.arguments, max(tokens, 1)))

    # -- the calls' arguments, then their output --------------------------------------------

    def _read_file(self, rng: random.Random) -> dict[str, Any]:
        return {"path": source_path(rng), "offset": 1, "limit": 400}

    def _file_lines(self, rng: random.Random, arguments: dict[str, Any], tokens: int) -> str:
        return self._numbered(rng, tokens)

    def _write_file(self, rng: random.Random) -> dict[str, Any]:
        return {"path": source_path(rng, test=True), "content": "\n".join(self._code(rng, 2))}

    def _wrote(self, rng: random.Random, arguments: dict[str, Any], tokens: int) -> str:
        return self._report(rng, f"Wrote {arguments['path']} (2 lines). Its neighbours:", tokens)

    def _edit_file(self, rng: random.Random) -> dict[str, Any]:
        old, new = rng.choice(EDITS)
        return {"path": source_path(rng), "old_string": old, "new_string": new}

    def _edited(self, rng: random.Random, arguments: dict[str, Any], tokens: int) -> str:
        return self._report(rng, f"Edited {arguments['path']}: 1 replacement. The file now reads:", tokens)

    def _list_dir(self, rng: random.Random) -> dict[str, Any]:
        return {"path": f"src/{rng.choice(MODULES)}"}

    def _listing(self, rng: random.Random, arguments: dict[str, Any], tokens: int) -> str:
        def entries() -> Iterator[str]:
            while True:
                yield f"{rng.choice(NAMES)}_{rng.choice(FIELDS)}.py  {rng.randint(1, 40)} KiB\n"

        return self.texts.grow(f"{arguments['path']}/\n__init__.py  1 KiB\n", entries(), tokens).rstrip("\n")

    def _glob(self, rng: random.Random) -> dict[str, Any]:
        return {"pattern": "**/*.py", "path": "src"}

    def _paths(self, rng: random.Random, arguments: dict[str, Any], tokens: int) -> str:
        def paths() -> Iterator[str]:
            while True:
                yield source_path(rng, test=rng.random() < 0.5) + "\n"

        return self.texts.grow("", paths(), tokens).rstrip("\n")

    def _search(self, rng: random.Random) -> dict[str, Any]:
        return {"pattern": f"{rng.choice(NAMES)}_{rng.choice(FIELDS)}\\(", "path": "src", "include": "*.py"}

    def _matches(self, rng: random.Random, arguments: dict[str, Any], tokens: int) -> str:
        def matches() -> Iterator[str]:
            for line in self._code(rng):
                yield f"{source_path(rng)}:{rng.randint(2, 400)}: {line.strip()}\n"

        return self.texts.grow("", matches(), tokens).rstrip("\n")

    def _run_command(self, rng: random.Random) -> dict[str, Any]:
        module = rng.choice(MODULES)
        return {"command": f"python -m pytest -q tests/{module}", "description": f"Run the {module} tests"}

    def _test_run(self, rng: random.Random, arguments: dict[str, Any], tokens: int) -> str:
        folder = arguments["command"].rpartition(" ")[2]

        def lines() -> Iterator[str]:
            while True:
                name, field = rng.choice(NAMES), rng.choice(FIELDS)
                verdict = rng.choice(["PASSED", "PASSED", "PASSED", "FAILED"])
                yield f"{folder}/test_{name}.py::test_{name}_{field} {verdict}\n"

        return self.texts.grow(f"$ {arguments['command']}\n", lines(), tokens) + "exit status 1"

    def _web_fetch(self, rng: random.Random) -> dict[str, Any]:
        return {"url": f"https://wiki.example.com/engineering/{rng.choice(MODULES)}-style", "format": "markdown"}

    def _page(self, rng: random.Random, arguments: dict[str, Any], tokens: int) -> str:
        head = f"# {arguments['url'].rpartition('/')[2]}\n"
        return head + self.texts.rules(rng.randint(1, 500), tokens - len(self.texts.tokenize(head)), "- ")

    def _todo_write(self, rng: random.Random) -> dict[str, Any]:
        steps = ["Write a failing test", "Fix it"]
        return {
            "todos": [
                {"id": str(number + 1), "content": step, "status": "pending", "priority": "high"}
                for number, step in enumerate(steps)
            ]
        }

    def _todo_list(self, rng: random.Random, arguments: dict[str, Any], tokens: int) -> str:
        return self._report(rng, f"To-do list updated: {len(arguments['todos'])} items. The file under test:", tokens)

    def _ask_followup_question(self, rng: random.Random) -> dict[str, Any]:
        return {
            "question": f"Should an empty {rng.choice(NAMES)} {rng.choice(FIELDS)} count as zero or be refused?",
            "options": ["count it as zero", "refuse it"],
        }

    def _answer(self, rng: random.Random, arguments: dict[str, Any], tokens: int) -> str:
        return self._report(rng, "The user answered: refuse it, with a clear error. The code in question:", tokens)

    # -- pieces ------------------------------------------------------------------------------

    def _code(self, rng: random.Random, count: int | None = None) -> Iterator[str]:
        """Lines of code from the bank (`count` of them, or without end)."""
        made = 0
        while count is None or made < count:
            made += 1
            yield filled(rng, rng.choice(CODE_LINES))

    def _numbered(self, rng: random.Random, tokens: int) -> str:
        """Lines of a file as read_file shows them (numbered), about `tokens` long."""
        start = rng.randint(1, 200)

        def pieces() -> Iterator[str]:
            for number, line in enumerate(self._code(rng), start):
                yield f"{number:5d}\t{line}\n"

        return self.texts.grow("", pieces(), tokens).rstrip("\n")

    def _report(self, rng: random.Random, head: str, tokens: int) -> str:
        """A tool's one-line report, then file lines, about `tokens` in all."""
        room = tokens - len(self.texts.tokenize(head))
        return f"{head}\n{self._numbered(rng, room)}" if room > 0 else head


def filled(rng: random.Random, template: str) -> str:
    """A line of the banks with its names and numbers drawn."""
    name = rng.choice(NAMES)
    return template.format(
        name=name,
        Name=name.capitalize(),
        field=rng.choice(FIELDS),
        module=rng.choice(MODULES),
        region=rng.choice(REGIONS),
        n=rng.randint(2, 400),
        k=rng.randint(1, 9),
    )


def source_path(rng: random.Random, *, test: bool = False) -> str:
    module, name = rng.choice(MODULES), rng.choice(NAMES)
    return f"tests/{module}/test_{name}.py" if test else f"src/{module}/{name}.py"


Arguments = Callable[[AgentTexts, random.Random], dict[str, Any]]
Output = Callable[[AgentTexts, random.Random, dict[str, Any], int], str]
# Per tool: its arguments at a step, and its output for them.
ARGUMENTS: dict[str, Arguments] = {
    "read_file": AgentTexts._read_file,
    "write_file": AgentTexts._write_file,
    "edit_file": AgentTexts._edit_file,
    "list_dir": AgentTexts._list_dir,
    "glob": AgentTexts._glob,
    "search": AgentTexts._search,
    "run_command": AgentTexts._run_command,
    "web_fetch": AgentTexts._web_fetch,
    "todo_write": AgentTexts._todo_write,
    "ask_followup_question": AgentTexts._ask_followup_question,
}
OUTPUTS: dict[str, Output] = {
    "read_file": AgentTexts._file_lines,
    "write_file": AgentTexts._wrote,
    "edit_file": AgentTexts._edited,
    "list_dir": AgentTexts._listing,
    "glob": AgentTexts._paths,
    "search": AgentTexts._matches,
    "run_command": AgentTexts._test_run,
    "web_fetch": AgentTexts._page,
    "todo_write": AgentTexts._todo_list,
    "ask_followup_question": AgentTexts._answer,
}
