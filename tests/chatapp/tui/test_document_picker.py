"""The document picker (Ctrl+O): a tree of what can be attached, a path field that completes names."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.app import App
from textual.pilot import Pilot
from textual.widgets import Label
from textual.widgets.directory_tree import DirEntry
from textual.widgets.tree import TreeNode

from chatapp.tui.app import ChatApp
from chatapp.tui.document_picker import DocumentPicker, DocumentTree, PathInput
from tests.tui_support import make_app, running, wait_idle, wait_ready, wait_until

NOTES = "The lighthouse at Cape Wrath was built in 1828 and painted white."


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A folder with documents, other files, a subfolder and hidden entries."""
    docs = tmp_path / "docs"
    (docs / "archive").mkdir(parents=True)
    (docs / ".git").mkdir()
    for name in ("lighthouses.txt", "plan.md", "README", ".hidden.md", "archive/old.txt"):
        (docs / name).write_text(NOTES, encoding="utf-8")
    for name in ("photo.png", "script.py", "archive/data.csv"):
        (docs / name).write_bytes(b"not a document")
    (docs / "paper.pdf").write_bytes(b"%PDF-1.4")
    return docs


class PickerHost(App[None]):
    """The picker alone, without a model: what it returns is kept."""

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder = folder
        self.returned: list[Path | None] = []

    def on_mount(self) -> None:
        self.push_screen(DocumentPicker(self.folder), self.returned.append)


def labels(node: TreeNode[DirEntry]) -> list[str]:
    return [str(child.label) for child in node.children]


@pytest.fixture
def app(data_dir: Path, folder: Path, monkeypatch: pytest.MonkeyPatch) -> ChatApp:
    monkeypatch.chdir(folder)  # the picker starts in the working directory until a document is attached
    return make_app(data_dir)


async def open_picker(pilot: Pilot[None], app: ChatApp) -> DocumentPicker:
    """Ctrl+O once the model is ready; returns the picker once its tree is filled."""
    await wait_ready(pilot, app)
    await pilot.press("ctrl+o")
    await wait_until(pilot, lambda: isinstance(app.screen, DocumentPicker))
    picker = app.screen
    assert isinstance(picker, DocumentPicker)
    await wait_until(pilot, lambda: bool(picker.query_one(DocumentTree).root.children))
    return picker


def problem(picker: DocumentPicker) -> str:
    return str(picker.query_one("#document-problem", Label).render())


async def test_the_tree_shows_folders_and_attachable_files_only(folder: Path) -> None:
    app = PickerHost(folder)
    async with running(app, ready=False) as pilot:
        tree = app.screen.query_one(DocumentTree)
        await wait_until(pilot, lambda: bool(tree.root.children))
        assert labels(tree.root) == ["archive", "lighthouses.txt", "paper.pdf", "plan.md", "README"]
        archive = tree.root.children[0]
        archive.expand()
        await wait_until(pilot, lambda: bool(archive.children))
        assert labels(archive) == ["old.txt"]


async def test_a_file_chosen_in_the_tree_is_taken_as_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real path, not typed text: a folder literally named `~` is that folder, not the home folder."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    folder = tmp_path / "~" / "docs"
    folder.mkdir(parents=True)
    (folder / "notes.md").write_text(NOTES, encoding="utf-8")
    app = PickerHost(folder)
    async with running(app, ready=False) as pilot:
        tree = app.screen.query_one(DocumentTree)
        await wait_until(pilot, lambda: bool(tree.root.children))
        await pilot.press("down")  # from the field to the tree
        while tree.cursor_node is None or str(tree.cursor_node.label) != "notes.md":
            await pilot.press("down")
        picker = app.screen
        assert isinstance(picker, DocumentPicker)
        await pilot.press("enter")
        await wait_until(pilot, lambda: bool(app.returned) or bool(problem(picker)))
        assert app.returned == [folder / "notes.md"], problem(picker) if not app.returned else ""


async def test_typing_a_folder_browses_it_and_a_lone_file_completes(folder: Path) -> None:
    app = PickerHost(folder)
    async with running(app, ready=False) as pilot:
        field = app.screen.query_one(PathInput)
        tree = app.screen.query_one(DocumentTree)
        assert field.value == f"{folder}/", "the field starts in the picker's folder"
        await pilot.press("a", "r")
        await wait_until(pilot, lambda: field._suggestion == f"{folder}/archive/")
        await pilot.press("tab")
        assert field.value == f"{folder}/archive/"
        await wait_until(pilot, lambda: tree.path == folder / "archive")
        await wait_until(pilot, lambda: field._suggestion == f"{folder}/archive/old.txt")
        await pilot.press("right", "enter")
        assert app.returned == [folder / "archive" / "old.txt"]


async def test_choosing_a_file_in_the_tree_attaches_it(
    app: ChatApp, folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running(app, ready=False) as pilot:
        picker = await open_picker(pilot, app)
        tree = picker.query_one(DocumentTree)
        assert tree.path == folder
        await pilot.press("down")  # from the field to the tree
        assert app.focused is tree
        while tree.cursor_node is None or str(tree.cursor_node.label) != "lighthouses.txt":
            await pilot.press("down")
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.service.current.view().document is not None)
        await wait_idle(pilot, app)
        assert "Document: lighthouses.txt" in str(app.main_screen.query_one("#branch-info").render())
        attached = app.service.current.view().document
        assert attached is not None
        assert attached.source_path == str(folder / "lighthouses.txt")

        monkeypatch.chdir(tmp_path)
        picker = await open_picker(pilot, app)
        assert picker.query_one(DocumentTree).path == folder, "it opens where the last document was"
        assert picker.query_one(PathInput).value == f"{folder}/"
        await pilot.press("escape")


async def test_a_typed_prefix_completes_and_attaches(app: ChatApp, folder: Path) -> None:
    async with running(app, ready=False) as pilot:
        picker = await open_picker(pilot, app)
        field = picker.query_one(PathInput)
        await pilot.press("p", "l")
        await wait_until(pilot, lambda: field._suggestion == f"{folder}/plan.md")
        await pilot.press("tab", "enter")
        await wait_until(pilot, lambda: app.service.current.view().document is not None)
        await wait_idle(pilot, app)
        assert "Document: plan.md" in str(app.main_screen.query_one("#branch-info").render())


async def test_a_bad_typed_path_says_what_is_wrong_and_attaches_nothing(app: ChatApp, folder: Path) -> None:
    async with running(app, ready=False) as pilot:
        picker = await open_picker(pilot, app)
        field = picker.query_one(PathInput)
        for typed, message in [
            ("missing.txt", f"document {folder}/missing.txt does not exist; check the path"),
            ("photo.png", f"document {folder}/photo.png has an unsupported type '.png'; use a .txt, .md or .pdf file"),
            ("archive", f"document {folder}/archive is a folder; pass a .txt, .md or .pdf file"),
        ]:
            field.value = typed
            await pilot.press("enter")
            assert problem(picker) == message
            assert app.screen is picker, "the dialog stays open to fix the path"
        await pilot.press("backspace")
        assert problem(picker) == "", "the line goes once the path changes"
        assert app.service.current.view().document is None


async def test_escape_cancels(app: ChatApp, folder: Path) -> None:
    async with running(app, ready=False) as pilot:
        picker = await open_picker(pilot, app)
        picker.query_one(PathInput).value = str(folder / "plan.md")
        await pilot.press("escape")
        await wait_until(pilot, lambda: app.screen is app.main_screen)
        await wait_idle(pilot, app)
        assert app.service.current.view().document is None
        assert not app.main_screen.documents.reading
