"""Fixtures shared by more than one test folder."""

import json
import os

import pytest

# hidden 2 x 16 = 32: not a multiple of 64, so a .pt's tensors alone cannot give the heads
TINY_PADDLEMIX_JSON = {"num_layers": 2, "num_attention_heads": 2, "attention_head_dim": 16, "sample_size": 8,
                       "patch_size": 2, "in_channels": 4, "out_channels": 8, "num_embeds_ada_norm": 10}


@pytest.fixture
def pt_and_json(tmp_path):
    """(tiny.pt with random "model" and "ema" weights, the PaddleMIX DiT.json it was built from, the model)."""
    import torch

    from dit_trainer.convert.model_config import build_dit
    from dit_trainer.config.model_file import load_model_file

    path = tmp_path / "DiT.json"
    path.write_text(json.dumps(TINY_PADDLEMIX_JSON))
    model = build_dit(load_model_file(path))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # DiT's init zeroes adaLN and the head, which would hide mistakes
        for name, p in model.named_parameters():
            if name != "pos_embed":
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    torch.save({"model": model.state_dict(), "ema": model.state_dict()}, tmp_path / "tiny.pt")
    return tmp_path / "tiny.pt", path, model


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """torch on one thread in every test, and OMP_NUM_THREADS=1 for the processes tests start: tiny tensors lose
    more to thread hand-offs than they gain, and on a loaded 2-core machine a 2-thread step of a tiny model
    costs 10x the CPU time of a 1-thread one. Session-wide, so module fixtures (trained runs) get it too."""
    import torch

    previous, previous_env = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"
    yield
    torch.set_num_threads(previous)
    if previous_env is None:
        os.environ.pop("OMP_NUM_THREADS", None)
    else:
        os.environ["OMP_NUM_THREADS"] = previous_env


@pytest.fixture
def scalar_kernels():
    """Inductor writes scalar C++ kernels inside (TORCHINDUCTOR_VEC_ISA_OK=0): gcc builds them in about half the
    time of the vectorised ones; what dynamo traces, the graphs, their recompiles and the caches are the same."""
    from torch._inductor import config

    with config.patch({"cpp.vec_isa_ok": False}):
        yield


@pytest.fixture
def offline_hub(monkeypatch):
    """The Hugging Face Hub unreachable: every metadata probe fails at once; the list holds their timeouts."""
    import huggingface_hub

    probes = []

    def unreachable(url, timeout=None, **kwargs):
        probes.append(timeout)
        raise OSError("[Errno -2] Name or service not known")

    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", unreachable)
    return probes


@pytest.fixture(autouse=True)
def no_inception_download(monkeypatch, tmp_path_factory):
    """No test reaches the FID Inception's release URL or a real hub cache: the URL names a missing local
    file and TORCH_HOME an empty folder; tests of the fetch point both elsewhere."""
    from dit_trainer.evaluate import inception_weights

    home = tmp_path_factory.getbasetemp() / "torch_home"
    monkeypatch.setenv("TORCH_HOME", str(home))
    monkeypatch.setattr(inception_weights, "INCEPTION_WEIGHTS_URL", (home / "missing" / "weights.pth").as_uri())


@pytest.fixture(scope="session")
def tiny_latent_shards(tmp_path_factory):
    """(shard folder from `dit extract` of 9 random 16 px images in 2 classes, the tiny random VAE folder that
    encoded them)."""
    pytest.importorskip("diffusers")
    import numpy as np
    import torch
    from diffusers import AutoencoderKL
    from PIL import Image

    from dit_trainer.cli import main

    root = tmp_path_factory.mktemp("latent_shards")
    torch.manual_seed(0)
    AutoencoderKL(block_out_channels=(8, 16), down_block_types=("DownEncoderBlock2D",) * 2,
                  up_block_types=("UpDecoderBlock2D",) * 2, layers_per_block=1, latent_channels=4,
                  norm_num_groups=8, sample_size=16).save_pretrained(root / "vae")
    rng = np.random.default_rng(0)
    for i in range(9):
        (root / "images" / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        image = Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8))
        image.save(root / "images" / f"c{i % 2}" / f"{i}.png")
    assert main(["extract", "--data-path", str(root / "images"), "--vae", str(root / "vae"), "--image-size", "16",
                 "--out", str(root / "shards"), "--batch-size", "4", "--workers", "0", "--no-progress"]) == 0
    return root / "shards", root / "vae"


@pytest.fixture
def tiny_train_losses(tmp_path):
    """Factory: losses(steps, **sections) -> per-step losses of a tiny DiT (or SiT) trained on one fixed batch."""
    import torch

    from dit_trainer.config import build_config
    from dit_trainer.train import DiTTrainer

    def losses(steps, **sections):
        cfg = {"output_dir": str(tmp_path / "run"), "optim": {"lr": 1e-3},
               "model": {"name": "DiT-S/2", "input_size": 8, "in_channels": 4, "num_classes": 10,
                         "depth": 2, "hidden_size": 64, "num_heads": 4, "learn_sigma": False},
               "train": {"global_batch_size": 8, "device": "cpu", "mixed_precision": "fp32"},
               "logging": {"progress": False, "tensorboard": False}}
        for name, values in sections.items():
            cfg.setdefault(name, {}).update(values) if isinstance(values, dict) else cfg.__setitem__(name, values)
        torch.manual_seed(0)
        trainer = DiTTrainer(build_config(cfg))
        g = torch.Generator().manual_seed(1)
        # Data of small spread: the part of the loss a network can learn shows within a few dozen steps.
        x, y = 0.1 * torch.randn(8, 4, 8, 8, generator=g), torch.randint(0, 10, (8,), generator=g)
        return [trainer.train_step((x, y))["loss"] for _ in range(steps)]

    return losses
