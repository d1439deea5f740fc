"""The app killed (SIGKILL) in the middle of an answer: after a restart every completed message
is there, and the partial answer is kept and marked as cut off (the tiny model, in a child process)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from chatapp.services.library import open_library
from chatapp.services.startup import open_workspace
from chatapp.tui.format import STATUS_NOTES
from chatapp.vocabulary import Role
from tests.chatapp.services.crash_support import FIRST_QUESTION, SECOND_QUESTION
from tests.child_support import start_child
from tests.model_factory import write_tiny_llama
from tests.service_support import settings

# A child process per kill.
pytestmark = pytest.mark.slow

KILLS = 3


def test_3_kills_mid_answer_keep_every_message_and_mark_the_partial_one(tmp_path: Path) -> None:
    model = write_tiny_llama(tmp_path / "tiny.gguf")
    for kill in range(KILLS):
        data_dir = tmp_path / f"data-{kill}"
        child = start_child("tests.chatapp.services.crash_support", str(model), str(data_dir), first_line="streaming")
        time.sleep(0.1 * kill)
        child.send_signal(signal.SIGKILL)
        child.wait(30)

        workspace = open_workspace(str(data_dir), settings(model))
        library = open_library(workspace)
        try:
            (conversation,) = library.conversations.list_conversations()
            assert conversation.active_leaf_id is not None
            messages = [
                m
                for m in library.conversations.path(conversation.active_leaf_id)
                if m.role in (Role.USER, Role.ASSISTANT)
            ]
            assert [m.role for m in messages] == [Role.USER, Role.ASSISTANT, Role.USER, Role.ASSISTANT]
            assert [messages[0].content, messages[2].content] == [FIRST_QUESTION, SECOND_QUESTION]
            assert messages[1].status != "partial"
            assert messages[1].content
            cut = messages[3]
            assert cut.status == "partial"
            assert cut.generated_ids
            assert cut.content
            assert STATUS_NOTES[cut.status].startswith("cut off")
        finally:
            library.close()
