"""`torchrun --nproc_per_node 2 -m dit_trainer train ... --parallel.X 2` writes the losses of the
1-process run (< 1e-5 relative); a degree product that is not the world size is a one-line error."""

import pytest
import yaml

from tests.parallel._common import launch, read_losses

pytestmark = pytest.mark.distributed

STEPS = 6
CONFIG = {
    "model": {"name": "DiT-S/2", "input_size": 8, "in_channels": 1, "num_classes": 10,
              "depth": 4, "hidden_size": 64, "num_heads": 4},
    "data": {"path": "digits", "digits_size": 8, "num_workers": 0},
    "optim": {"lr": 1e-3},
    "train": {"max_steps": STEPS, "global_batch_size": 8, "mixed_precision": "fp32", "device": "cpu", "seed": 0},
    "checkpoint": {"save_steps": 1000},
    "logging": {"log_steps": 1, "tensorboard": False, "progress": False},
}


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "tiny.yaml"
    path.write_text(yaml.safe_dump(CONFIG))
    return path


@pytest.fixture(scope="module")
def single(config):
    from dit_trainer.cli import main

    out = config.parent / "single"
    assert main(["train", "--config", str(config), "--output_dir", str(out)]) == 0
    return read_losses(out)


@pytest.mark.parametrize("flag", ["--parallel.dp_shard", "--parallel.tp", "--parallel.pp"])
def test_torchrun_cli_matches_single_process(config, single, flag):
    out = config.parent / flag.split(".")[-1]
    launch(2, "-m", "dit_trainer", "train", "--config", config, "--output_dir", out, flag, "2")
    got = read_losses(out)
    assert sorted(got) == list(range(1, STEPS + 1))
    for step, loss in single.items():
        assert abs(got[step] - loss) <= 1e-5 * abs(loss), f"step {step}: {got[step]} vs {loss}"


def test_wrong_degree_product_is_one_line(config):
    with pytest.raises(AssertionError) as info:
        launch(2, "-m", "dit_trainer", "train", "--config", config, "--output_dir", config.parent / "bad",
               "--parallel.tp", "4", "--parallel.dp_shard", "1")
    lines = [l for l in str(info.value).splitlines() if "dit train: error:" in l]
    assert lines, str(info.value)[-2000:]
    assert "do not multiply to the world size 2" in lines[0]
    # Each rank prints the message, not a traceback of it (torchrun adds its own report of the exit).
    assert "ConfigError" not in str(info.value)
