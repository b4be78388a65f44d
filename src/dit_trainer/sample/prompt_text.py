"""Prompts as text: a list checked, a prompt file read (one prompt per line), each stripped as training
captions are, anything else one line naming it. Torch-free (`SampleSettings` reads `--prompts FILE`)."""

from dit_trainer.errors import ConfigError

# The longest line a prompt file may hold: prompts are text a person or a benchmark wrote, not data.
MAX_PROMPT_BYTES = 64 * 1024


def _encodes(text: str) -> bool:
    # A command line's undecodable bytes arrive as lone surrogates, which no tokenizer takes.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_prompts(prompts, what: str = "prompts") -> list:
    """`prompts` (a string or a list of strings) as a non-empty list, each stripped as training captions are; a
    one-line error otherwise."""
    if isinstance(prompts, str):
        prompts = [prompts]
    prompts = list(prompts or ())
    if not prompts:
        raise ConfigError(f"no {what} to sample; pass --prompt TEXT or --prompts FILE (one prompt per line)")
    bad = next((p for p in prompts if not isinstance(p, str) or "\x00" in p or not _encodes(p)), None)
    if bad is not None:
        raise ConfigError(f"{what} must be UTF-8 strings without NUL bytes, got {bad!r}")
    return [p.strip() for p in prompts]


def read_prompts(path, flag: str = "--prompts") -> tuple:
    """The prompts of a text file, one per line (blank lines skipped, ends stripped); one line naming the file
    (as `flag`, the option or key that named it) when it cannot be read, is not UTF-8, holds a NUL byte or a
    line over 64 KiB, or holds no prompt."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as err:
        raise ConfigError(f"{flag} {path}: cannot read it ({err.strerror or err}); pass a text file with one "
                          "prompt per line") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{flag} {path} is not UTF-8 text (byte {err.start}); save it as UTF-8, one prompt per "
                          "line") from None
    prompts = []
    for number, line in enumerate(text.splitlines(), 1):
        if "\x00" in line or len(line.encode()) > MAX_PROMPT_BYTES:
            problem = "a NUL byte" if "\x00" in line else f"more than {MAX_PROMPT_BYTES // 1024} KiB"
            raise ConfigError(f"{flag} {path} line {number} holds {problem}; one prompt per line, as text")
        if line.strip():
            prompts.append(line.strip())
    if not prompts:
        raise ConfigError(f"{flag} {path} holds no prompt; write one prompt per line")
    return tuple(prompts)
