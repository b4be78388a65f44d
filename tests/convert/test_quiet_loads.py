"""Our VAE loads log no diffusers notice (the 'install accelerate' one), and leave diffusers' logging as it was."""

import logging

from diffusers.utils import logging as diffusers_logging

from dit_trainer.convert import convert
from dit_trainer.convert.pipeline import DiTPipeline


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_convert_and_pipeline_load_are_quiet_and_restore_the_level(ours_dir, tmp_path, monkeypatch):
    # Without accelerate installed diffusers logs its notice on every model load; pretend it is missing.
    import diffusers.models.modeling_utils as modeling_utils

    monkeypatch.setattr(modeling_utils, "is_accelerate_available", lambda: False)
    before = diffusers_logging.get_verbosity()
    records = _Records()
    logging.getLogger("diffusers").addHandler(records)
    diffusers_logging.set_verbosity_info()
    try:
        convert("ours", ours_dir, "diffusers", tmp_path / "d")
        DiTPipeline.from_pretrained(ours_dir)
        assert not [m for m in records.messages if "accelerate" in m]
        assert diffusers_logging.get_verbosity() == logging.INFO  # not silenced process-wide
        diffusers_logging.get_logger("diffusers.models.modeling_utils").warning("still heard")
        assert records.messages[-1:] == ["still heard"]
    finally:
        logging.getLogger("diffusers").removeHandler(records)
        diffusers_logging.set_verbosity(before)
