"""tools/ keeps its promises: each tool has its README line, reaches the engine only through its doors, and every
tool path the manual names exists."""

from __future__ import annotations

import ast
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
TOOLS = sorted(path for path in (ROOT / "tools").iterdir() if path.suffix in (".py", ".sh"))
DOORS = {"chatapp.engine.contract", "chatapp.engine.opening"}
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "tools" / "README.md", *(ROOT / "docs").glob("*.md")]


def engine_modules(path: Path) -> set[str]:
    named: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            named.add(node.module)
        elif isinstance(node, ast.Import):
            named.update(alias.name for alias in node.names)
    return {name for name in named if name.startswith("chatapp.engine.")}


def test_there_are_tools_and_each_has_its_line_in_the_readme() -> None:
    readme = (ROOT / "tools" / "README.md").read_text(encoding="utf-8")
    assert len(TOOLS) >= 10
    assert [tool.name for tool in TOOLS if f"`{tool.name}`" not in readme] == []


@pytest.mark.parametrize("tool", [tool for tool in TOOLS if tool.suffix == ".py"], ids=lambda tool: tool.name)
def test_a_tool_reaches_the_engine_only_through_its_doors(tool: Path) -> None:
    assert engine_modules(tool) <= DOORS


# A tool's path as the manual writes it; a removed one is named with the commit that still has it (abc1234:scripts/).
TOOL_PATH = re.compile(r"(?<![\w:/.])((?:tools|scripts)/[\w.-]+\.(?:py|sh))")


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_tool_the_manual_names_exists(page: Path) -> None:
    named = set(TOOL_PATH.findall(page.read_text(encoding="utf-8")))
    assert sorted(path for path in named if not (ROOT / path).is_file()) == []


def test_the_gpu_machines_path_runs_the_tool_with_its_arguments_and_environment(tmp_path: Path) -> None:
    (tmp_path / "scripts").mkdir()
    (tmp_path / "tools").mkdir()
    shim = tmp_path / "scripts" / "device_gpu_check.sh"
    shim.write_text((ROOT / "scripts" / "device_gpu_check.sh").read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / "tools" / "device_gpu_check.sh").write_text('echo "ran $PWD $DEADLINE_S $*"\n', encoding="utf-8")
    ran = subprocess.run(
        ["bash", "scripts/device_gpu_check.sh", "one", "two"],
        cwd=tmp_path,
        env={**os.environ, "DEADLINE_S": "330"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert ran.stdout.strip() == f"ran {tmp_path} 330 one two"
