"""`SampleSettings`: flags first, then the run's `sample:` section, then the release default, resolved once into a
frozen value; a guide weight with no guide anywhere is refused, not ignored."""

import dataclasses
import math
from types import SimpleNamespace

import pytest

from dit_trainer.config import SampleConfig
from dit_trainer.errors import ConfigError
from dit_trainer.sample.settings import SampleSettings, check_flags, from_flags, given_of, resolve


def _flags(**given):
    keys = ("ckpt", "cfg_scale", "guide", "guide_scale", "guidance_interval", "ema_std", "sampler", "steps", "ode_method",
            "atol")
    return SimpleNamespace(**{**{k: None for k in keys}, "ckpt": "run", "seed": 3, "no_progress": True,
                              "release_cfg_scale": 4.0, **given})


def test_flags_then_the_run_then_the_release():
    run = SampleConfig(cfg_scale=1.5, guide="50%", guide_scale=2.0, guidance_interval=[1.0, ".inf"], steps=9)
    s = from_flags(_flags(steps=20, ode_method="euler"), run)
    assert (s.cfg_scale, s.guide, s.guide_origin, s.guide_scale, s.steps, s.seed) == (1.5, "50%", "sample.guide", 2.0,
                                                                                      20, 3)
    assert s.guidance_interval == (1.0, math.inf) and s.options == {"ode_method": "euler"} and not s.progress
    flagged = from_flags(_flags(guide="7", cfg_scale=1.0), run)
    assert (flagged.guide, flagged.guide_origin, flagged.guide_scale, flagged.cfg_scale) == ("7", "--guide", 2.0, 1.0)
    plain = from_flags(_flags(), None)
    assert (plain.cfg_scale, plain.guide, plain.guide_scale, plain.guidance_interval) == (4.0, None, 1.0, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.steps = 3  # resolved once: nothing downstream changes it


def test_a_guide_weight_without_a_guide_is_refused():
    with pytest.raises(ConfigError, match=r"^--guide-scale 3 needs a guide, and neither --guide nor the run's "
                                          r"sample.guide names one; pass --guide CKPT"):
        from_flags(_flags(guide_scale=3.0), SampleConfig())
    # 1 is "no autoguidance": harmless without a guide, and it turns a recommended one off.
    assert from_flags(_flags(guide_scale=1.0), None).guide is None
    assert from_flags(_flags(guide_scale=1.0), SampleConfig(guide="3", guide_scale=2.0)).guide is None
    assert from_flags(_flags(guide_scale=3.0), SampleConfig(guide="3", guide_scale=2.0)).guide_scale == 3.0


def test_flag_values_are_checked_before_any_checkpoint_is_read():
    for given, words in (({"cfg_scale": 0.5}, "--cfg-scale is 0.5"), ({"guide_scale": math.nan}, "--guide-scale is nan"),
                         ({"guide": "phema/std0.5@50%"}, "std0.5 is no post-hoc EMA width"),
                         ({"ema_std": "wide"}, "--ema-std is 'wide'"), ({"steps": 0}, "--steps is 0"),
                         ({"guidance_interval": [2, 1]}, "--guidance-interval must satisfy")):
        with pytest.raises(ConfigError, match=words):
            check_flags(given)
    check_flags({"ema_std": "none", "guide": "50%"})


def test_a_commands_flags_are_its_settings():
    given = given_of(_flags(atol=1e-3))
    assert given["sampler_options"] == (("atol", 1e-3),) and given["progress"] is False
    assert resolve({"ckpt": "x"}) == SampleSettings("x")


def test_prompts_and_the_negative_prompt_are_settings(tmp_path):
    """--prompt / --prompts FILE become the prompts tuple; a run may recommend the negative prompt, the flag wins."""
    run = SampleConfig(negative_prompt="blurry")
    s = from_flags(_flags(prompt=[" a cat ", "two dogs"]), run)
    assert (s.prompts, s.negative_prompt, s.text_encoder) == (("a cat", "two dogs"), "blurry", None)
    (tmp_path / "p.txt").write_text("a cat\n\n two dogs\n")
    s = from_flags(_flags(prompts_file=str(tmp_path / "p.txt"), negative_prompt="", text_encoder="t5"), run)
    assert (s.prompts, s.negative_prompt, s.text_encoder) == (("a cat", "two dogs"), "", "t5")
    assert from_flags(_flags(), None).prompts is None  # class labels, as before
