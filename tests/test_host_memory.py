"""host_memory.keep_freed_memory: large blocks freed and allocated again stop page-faulting; the
commands that compute on a CPU (`dit train` among them) apply it, the `DiTTrainer` they build does
not (a process-wide setting is the caller's). The cases run in fresh processes, since the setting is
process-wide and cannot be undone."""

import json
import subprocess
import sys

import pytest

from dit_trainer.host_memory import glibc_malloc

glibc_only = pytest.mark.skipif(not glibc_malloc(), reason="mallopt is glibc's; elsewhere keep_freed_memory is a no-op")

# Four 64 MiB blocks (above glibc's largest dynamic mmap threshold) allocated, written and freed
# per "step"; three steps settle the heap (torch asks for 64-byte aligned blocks, which a freed block
# of the same size does not always fit until its neighbours have merged), the next three are counted.
FAULTS = r"""
import resource, sys, torch
from dit_trainer.host_memory import freed_memory_kept, keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory() and freed_memory_kept()
def step():
    for _ in range(4):
        a = torch.empty(64 * 2**20 // 4)
        a.fill_(1.0)
        del a
for _ in range(3):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""

PAGES = 3 * 4 * 64 * 2**20 // 4096  # of the counted steps


def _faults(mode):
    out = subprocess.run([sys.executable, "-c", FAULTS, mode], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return int(out.stdout.split()[-1])


@glibc_only
def test_freed_blocks_are_reused_without_page_faults():
    assert _faults("glibc") >= 0.9 * PAGES  # glibc's default maps and faults them every time
    assert _faults("keep") < 0.25 * PAGES  # seen: 0, or one block of the twelve


# One fresh process answers every case below in turn (each process start costs seconds): the rule for
# each device, then library code's DiTTrainer, then each command run to its end on tiny inputs. The
# setting is process-wide and cannot be undone, so before each case the process forgets that it was
# applied (`_applied`, the flag freed_memory_kept reads): what each case reports is whether it applied it.
CASES = r"""
import json, sys
from dit_trainer import host_memory
from dit_trainer.host_memory import freed_memory_kept, keep_freed_memory_on
got = {}
assert not freed_memory_kept()
got["rules"] = [keep_freed_memory_on("cuda"), keep_freed_memory_on("not a device"), freed_memory_kept(),
                keep_freed_memory_on("cpu"), freed_memory_kept()]
tiny = {"output_dir": sys.argv[1], "model.name": "DiT-S/8", "model.depth": "1", "model.hidden_size": "32",
        "model.num_heads": "2", "data.path": "digits", "data.digits_size": "8", "data.num_workers": "0",
        "train.device": "cpu", "train.global_batch_size": "2", "train.max_steps": "1",
        "logging.progress": "false", "logging.tensorboard": "false"}
host_memory._applied = False
from dit_trainer.train import DiTTrainer
DiTTrainer({**tiny, "output_dir": sys.argv[1] + "-library"}).train()
got["library"] = freed_memory_kept()
from dit_trainer.cli import main
commands = {"command": ["train", *[item for key, value in tiny.items() for item in (f"--{key}", value)]],
            **json.loads(sys.argv[2])}
for name, argv in commands.items():
    host_memory._applied = False
    assert main(argv) == 0, name
    got[name] = freed_memory_kept()
print(json.dumps(got))
"""


def _eval_args(tmp_path):
    import numpy as np

    np.savez(tmp_path / "s.npz", arr_0=np.random.default_rng(0).integers(0, 255, (12, 16, 16, 3), dtype=np.uint8))
    return ["eval", "--network", "digits", "--samples", str(tmp_path / "s.npz"), "--ref", "digits", "--device", "cpu",
            "--no-progress"]


def _extract_args(tmp_path):
    import numpy as np
    from diffusers import AutoencoderKL
    from PIL import Image

    AutoencoderKL(block_out_channels=(8, 8), down_block_types=("DownEncoderBlock2D",) * 2,
                  up_block_types=("UpDecoderBlock2D",) * 2, layers_per_block=1, latent_channels=4,
                  norm_num_groups=8, sample_size=16).save_pretrained(tmp_path / "vae")
    (tmp_path / "img" / "a").mkdir(parents=True)
    for i in range(2):
        Image.fromarray(np.random.default_rng(i).integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(
            tmp_path / "img" / "a" / f"{i}.png")
    return ["extract", "--data-path", str(tmp_path / "img"), "--vae", str(tmp_path / "vae"), "--image-size", "16",
            "--out", str(tmp_path / "out"), "--workers", "0", "--device", "cpu", "--no-progress"]


@pytest.fixture(scope="module")
def applied(tmp_path_factory):
    """{case: whether it applied keep_freed_memory} from one fresh process; "rules" holds the device rule's answers."""
    tmp_path = tmp_path_factory.mktemp("host_memory")
    commands = {"eval": _eval_args(tmp_path), "extract": _extract_args(tmp_path)}
    out = subprocess.run([sys.executable, "-c", CASES, str(tmp_path / "run"), json.dumps(commands)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.splitlines()[-1])


@glibc_only
@pytest.mark.parametrize("caller", ["library", "command"])
def test_dit_train_applies_it_on_cpu_and_the_trainer_leaves_it_to_the_caller(applied, caller):
    assert applied[caller] is (caller == "command")


@glibc_only
def test_keep_freed_memory_on_applies_only_to_cpu_devices(applied):
    # GPU runs leave the host's malloc alone; a bad device is the command's own check to word.
    assert applied["rules"] == [False, False, False, True, True]


@glibc_only
@pytest.mark.parametrize("command", ["eval", "extract"])
def test_cpu_commands_keep_freed_memory(applied, command):
    assert applied[command] is True
