"""Guide specs (`config.guide_spec`): steps, shares of the run, post-hoc EMAs at a share, folders; and the
checkpoint `eval.guide` names is one the run keeps, decided when the config is built."""

from fractions import Fraction

import pytest

from dit_trainer.cli import main
from dit_trainer.config import build_config
from dit_trainer.config.guide_spec import nearest_step, parse_guide, step_at
from dit_trainer.errors import ConfigError


def test_the_four_forms():
    assert parse_guide("300").step == 300
    assert parse_guide("50%").share == Fraction(1, 2) and parse_guide("50%").std is None
    spec = parse_guide("phema/std0.100@12.5%")
    assert (spec.std, spec.share, spec.path) == (0.1, Fraction(1, 8), None) and spec.of_run
    assert parse_guide("phema/std0.100-step00000600").path == "phema/std0.100-step00000600"
    assert not parse_guide("../other/run").of_run


def test_shares_of_a_run_round_down_and_snapshots_go_to_the_nearest():
    assert step_at(Fraction(1, 2), 1200) == 600 and step_at(Fraction(1, 2), 25) == 12 and step_at(Fraction(1, 100), 5) == 1
    # Half of 300 (150) with snapshots at 200 and 300: 200 is the nearest, though past the half.
    assert nearest_step(Fraction(1, 2), 300, [200, 300]) == 200
    assert nearest_step(Fraction(1, 2), 14, [2, 4, 6, 8, 10, 12, 14]) == 6  # 7: 6 and 8 as near, the earlier
    assert nearest_step(Fraction(1, 2), 1200, [600, 1200, 1400]) == 600  # never past the main step
    assert nearest_step(Fraction(1, 2), 100, [200]) is None


def _cfg(eval_section, checkpoint=None, max_steps=10):
    return build_config({"data": {"path": "digits"}, "train": {"max_steps": max_steps},
                         "checkpoint": {"save_steps": 4, "save_total_limit": 1, **(checkpoint or {})},
                         "eval": {"every": 2, "guide_scale": 2.0, **eval_section}})


def test_eval_guide_joins_keep_steps_with_a_note(capsys):
    cfg = _cfg({"guide": "50%"})
    assert cfg.checkpoint.keep_steps == [5]
    assert "checkpoint.keep_steps gains 5, the step eval.guide 50% names" in capsys.readouterr().err
    assert build_config(cfg).checkpoint.keep_steps == [5]  # kept: built again, no second note
    assert capsys.readouterr().err == ""
    # A step rotation would remove joins too; one that is saved and never rotated away does not.
    assert _cfg({"guide": "4"}).checkpoint.keep_steps == [4]
    assert _cfg({"guide": "4"}, {"save_total_limit": 0}).checkpoint.keep_steps == []
    assert _cfg({"guide": "3"}, {"keep_steps": [3]}).checkpoint.keep_steps == [3]
    assert _cfg({"guide": "3", "every": 0}).checkpoint.keep_steps == []  # no training-time FID: nothing to keep


@pytest.mark.parametrize("guide, words", [("20", "eval.guide 20 is step 20, after train.max_steps 10: this run never "
                                                  "saves it"),
                                          ("phema/std0.100@50%", "names a post-hoc EMA, which is rebuilt"),
                                          ("0", "no checkpoint of step 0"),
                                          ("150%", r"share must lie in \(0%, 100%\]")])
def test_an_eval_guide_the_run_never_has_is_refused(guide, words):
    with pytest.raises(ConfigError, match=words):
        _cfg({"guide": guide})


def test_dit_train_refuses_it_in_one_line_before_training(tmp_path, capsys):
    code = main(["train", "--data.path", "digits", "--output_dir", str(tmp_path / "run"), "--train.max_steps", "10",
                 "--eval.every", "2", "--eval.guide", "30", "--eval.guide_scale", "2"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "eval.guide 30 is step 30, after train.max_steps 10" in err
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_sample_guide_is_checked_when_the_config_is_built():
    with pytest.raises(ConfigError, match=r"^sample.guide phema/std0.4@50%: std0.4 is no post-hoc EMA width"):
        build_config({"sample": {"guide": "phema/std0.4@50%", "guide_scale": 2.0}})
    assert build_config({"sample": {"guide": "phema/std0.1@50%", "guide_scale": 2.0}}).sample.guide == "phema/std0.1@50%"
