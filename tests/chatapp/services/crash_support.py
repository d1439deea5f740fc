"""A chat session to kill mid-answer (run as a script by test_crash.py).

    python -m tests.chatapp.services.crash_support MODEL DATA_DIR

Asks one question to the end, then a second one with a long answer; prints "streaming"
once the second answer has been saved at least once. The engine holds that answer after
its 60th token, so however fast the machine, the kill always lands mid-answer.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from chatapp.engine.engine import Engine, EngineConfig
from chatapp.engine.gate import Step
from chatapp.services import answers
from chatapp.services.library import open_library
from chatapp.services.startup import open_workspace
from chatapp.services.streams import AnswerText
from tests.model_factory import TINY_MODEL_THREADS
from tests.service_support import make_service, settings

FIRST_QUESTION = "What is a lighthouse?"
SECOND_QUESTION = "Tell me a very long story about its keeper."


def chat_until_killed(model: Path, data_dir: Path) -> None:
    answers.SAVE_EVERY_S = 0.05  # save often: the kill lands between saves of a long answer
    workspace = open_workspace(str(data_dir), settings(model, max_tokens=8))
    library = open_library(workspace)
    config = EngineConfig(model_path=model, context_cap=4096, sequences=1, threads=TINY_MODEL_THREADS)
    with Engine(config) as engine:
        service = make_service(workspace, library, engine)
        service.current.new_conversation()
        first = service.ask(FIRST_QUESTION)
        for _ in first.events():
            pass
        # The second answer could run until the context is full; it is held after 60 tokens.
        service.slot.workspace = replace(
            workspace, settings=workspace.settings.model_copy(update={"max_tokens": 100_000})
        )
        with engine.holding(Step.TOKEN, after=60):
            second = service.ask(SECOND_QUESTION)
            seen = 0
            for event in second.events():
                if isinstance(event, AnswerText):
                    seen += 1
                    if seen == 40:
                        print("streaming", flush=True)


if __name__ == "__main__":
    chat_until_killed(Path(sys.argv[1]), Path(sys.argv[2]))
