"""The manual's commands are ones chatapp takes: every `chatapp ...` command written in the README or in docs/
names a command (and a cache action) that exists, with flags that command has, so a renamed flag cannot leave
the manual stale."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from chatapp.cli import build_parser

ROOT = Path(__file__).parents[1]
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
# A command as written: in a code block's line (continued with a backslash) or in inline backticks.
COMMAND = re.compile(r"chatapp ([a-z]+)((?: +[^\s`|]+)*)")
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


def written_commands(text: str) -> list[tuple[str, str]]:
    joined = text.replace("\\\n", " ")
    found = []
    for line in joined.splitlines():
        pieces = (
            re.findall(r"`([^`]+)`", line) if not line.startswith(("    ", "chatapp", ".venv", "GEMMA")) else [line]
        )
        for piece in pieces:
            found += [(match.group(1), match.group(2)) for match in COMMAND.finditer(piece)]
    return found


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    actions = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    return dict(actions[0].choices) if actions else {}


def flags_of(parser: argparse.ArgumentParser) -> set[str]:
    known = {option for action in parser._actions for option in action.option_strings}
    for child in subcommands(parser).values():
        known |= flags_of(child)
    return known


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_chatapp_command_in_the_manual_exists_with_its_flags(page: Path) -> None:
    commands = subcommands(build_parser())
    written = written_commands(page.read_text(encoding="utf-8"))
    unknown = []
    for name, rest in written:
        if name not in commands:
            continue  # prose such as "chatapp serves" or "chatapp keeps"
        unknown += [f"chatapp {name} {flag}" for flag in FLAG.findall(rest) if flag not in flags_of(commands[name])]
    assert not unknown, f"{page.name} names flags chatapp does not take: {sorted(set(unknown))}"


MAKE_COMMAND = re.compile(r"(?:^|[`\s])make ([a-z][a-z0-9-]*)(?=[\s`]|$)")
MAKE_TARGET = re.compile(r"^([a-z][a-z0-9-]*):", re.MULTILINE)


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_make_target_in_the_manual_exists(page: Path) -> None:
    targets = set(MAKE_TARGET.findall((ROOT / "Makefile").read_text(encoding="utf-8")))
    text = page.read_text(encoding="utf-8")
    written = {
        match.group(1)
        for line in text.splitlines()
        for piece in (re.findall(r"`([^`]+)`", line) if not line.startswith(("make ", "    ")) else [line])
        for match in MAKE_COMMAND.finditer(piece)
    }
    assert written <= targets, f"{page.name} names make targets the Makefile lacks: {sorted(written - targets)}"


LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_link_in_the_manual_reaches_a_file(page: Path) -> None:
    targets = [target.split("#")[0] for target in LINK.findall(page.read_text(encoding="utf-8"))]
    local = [target for target in targets if target and "://" not in target and not target.startswith("mailto:")]
    missing = [target for target in local if not (page.parent / target).exists()]
    assert not missing, f"{page.name} links to files that are not there: {missing}"
