"""User-facing errors.

Every error a user can cause is a `ChatappError` whose message is one line that names the
problem and the fix. The CLI prints it and exits non-zero; the TUI shows it as a
notification. Anything else is a bug and may show a traceback.
"""


class ChatappError(Exception):
    """A problem the user can fix; `str(error)` is the one-line message to show."""

    exit_code = 2


class ModelError(ChatappError):
    """The model file is missing, unreadable, not GGUF, or llama.cpp cannot load it."""


class LoadCancelled(ModelError):
    """Loading a model was stopped before it finished (the user pressed Esc)."""


class DocumentError(ChatappError):
    """A document cannot be read or does not fit."""


class ContextOverflowError(ChatappError):
    """A prompt does not fit in the per-conversation context."""

    def __init__(self, message: str, *, prompt_tokens: int, context_tokens: int) -> None:
        super().__init__(message)
        self.prompt_tokens = prompt_tokens
        self.context_tokens = context_tokens


class SettingsError(ChatappError):
    """The settings file or a command-line value is invalid."""


class DataDirError(ChatappError):
    """The data folder cannot be created or written."""


class StoreError(ChatappError):
    """The conversations database cannot be opened, read or written."""


class PersonaError(ChatappError):
    """A persona is unknown, has a bad name, or its file cannot be read or parsed."""


class GrammarError(ChatappError):
    """An answer's grammar could not be built (a schema it cannot express, or llama.cpp refused it)."""
