"""Errors for bad input: each message is one line naming the file or key and what to do."""


class DitError(Exception):
    """Base for user-facing errors; the CLI prints these as one line, without a traceback."""


class ConfigError(DitError, ValueError):
    """A config key or value is wrong."""


class DataError(DitError, ValueError):
    """A dataset file or folder is wrong."""


class CheckpointError(DitError, ValueError):
    """A checkpoint or weights file cannot be used."""


class ResourceError(DitError, MemoryError):
    """A stage would need more memory than is available; refused before it starts."""


class DivergenceError(DitError, FloatingPointError):
    """Training produced a non-finite loss or gradient norm; the update was not applied."""


def one_line(err: BaseException) -> str:
    """The first line of an exception's message, for the one-line errors above (numpy's header
    errors and pickle's span several)."""
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__
