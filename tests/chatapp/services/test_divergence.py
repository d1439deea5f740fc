"""Where a prompt left an earlier one, with the text on both sides, on the bundled model's tokenizer."""

from __future__ import annotations

from chatapp.engine.llama_native import NativeModel
from chatapp.services.divergence import PromptLog

PERSONA = "You are a helpful assistant. The time is {time}. Answer the question below briefly."


def tokens(vocab: NativeModel, text: str) -> list[int]:
    return vocab.tokenize(text, add_special=False, parse_special=False)


def test_a_timestamp_in_the_persona_is_shown_where_it_breaks_the_prefix(vocab: NativeModel) -> None:
    log = PromptLog(vocab)
    first = tokens(vocab, PERSONA.format(time="10:41:07") + " Question one?")
    second = tokens(vocab, PERSONA.format(time="10:42:13") + " Question one?")
    assert log.compare(first) is None  # nothing earlier
    divergence = log.compare(second)
    assert divergence is not None
    assert first[: divergence.position] == second[: divergence.position]
    assert first[divergence.position] != second[divergence.position]
    assert divergence.before.endswith("The time is 10:4")
    assert divergence.after.startswith("2:13")
    assert divergence.earlier.startswith("1:07")
    assert "token" in divergence.describe()


def test_a_prompt_that_goes_on_from_an_earlier_one_has_no_divergence(vocab: NativeModel) -> None:
    log = PromptLog(vocab)
    turn = tokens(vocab, "System. User: hello. Assistant: hi.")
    assert log.compare(turn) is None
    assert log.compare([*turn, *tokens(vocab, " User: and then?")]) is None
    # Against the closest of several: the one sharing the longest beginning.
    other = tokens(vocab, "Something else entirely.")
    assert log.compare(other) is None
    divergence = log.compare([*turn[:5], *tokens(vocab, " different")])
    assert divergence is not None
    assert divergence.position == 5
