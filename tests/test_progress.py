"""Progress bars redraw on a terminal and stay out of log files: throttled to LOG_INTERVAL, or off
where the caller prints its own progress lines (training)."""

import io
import os
import pty
import sys

from dit_trainer.progress import progress_bar, redraws_in_place


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_terminal_redraws_in_place_and_a_file_does_not(tmp_path):
    leader, follower = pty.openpty()
    try:
        with os.fdopen(follower, "w") as terminal:
            assert redraws_in_place(terminal)
    finally:
        os.close(leader)
    with open(tmp_path / "log", "w") as log:
        assert not redraws_in_place(log)
    assert not redraws_in_place(io.StringIO())


def test_a_bar_to_a_file_is_not_redrawn_per_step_but_is_on_a_terminal(tmp_path):
    steps = 300
    with open(tmp_path / "log", "w") as log:
        for _ in progress_bar(range(steps), file=log, mininterval=0, miniters=1, desc="work"):
            pass
    written = (tmp_path / "log").read_text()
    assert written.count("work") <= 2 and len(written) < 400, written  # the first and the last state
    assert "300/300" in written
    terminal = _Terminal()
    for _ in progress_bar(range(steps), file=terminal, mininterval=0, miniters=1, desc="work"):
        pass
    assert terminal.getvalue().count("\r") >= steps // 2  # redrawn as it goes


def test_training_logged_to_a_file_has_its_lines_and_no_bar(tmp_path, monkeypatch):
    from tests.repa._tiny import digits_config  # the tiny digits run of the REPA tests, without REPA

    from dit_trainer.train import DiTTrainer

    cfg = digits_config(tmp_path / "run", steps=4, logging={"log_steps": 2, "progress": True})
    cfg.pop("repa")
    with open(tmp_path / "out.log", "w") as out:
        monkeypatch.setattr(sys, "stdout", out)
        monkeypatch.setattr(sys, "stderr", out)
        DiTTrainer(cfg).train()
    written = (tmp_path / "out.log").read_text()
    assert "\r" not in written and "train:" not in written, written[:500]
    assert [line.split()[1] for line in written.splitlines() if line.startswith("step ")] == ["2", "4"], written
