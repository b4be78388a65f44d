import subprocess
import sys

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from dit_trainer import sample as S
from dit_trainer.cli import main
from dit_trainer.config import Config, set_key
from dit_trainer.errors import ConfigError
from dit_trainer.host_memory import glibc_malloc
from dit_trainer.models import get_spec
from dit_trainer.diffusion.objective import diffusion_from_config
from dit_trainer.checkpoint import save_checkpoint

TINY = {"name": "DiT-S/4", "input_size": 8, "num_classes": 10, "depth": 2, "hidden_size": 64, "num_heads": 4}


def tiny_cfg(in_channels=1, data_path="digits", vae=None):
    cfg = Config()
    for key, value in TINY.items():
        set_key(cfg, f"model.{key}", value)
    cfg.model.in_channels = in_channels
    cfg.data.path, cfg.data.vae = data_path, vae
    cfg.data.digits_size = 8  # the data decides the model's shape: match the tiny model's input
    cfg.train.device, cfg.train.mixed_precision = "cpu", "fp32"
    return cfg


def tiny_model(cfg, seed=0):
    torch.manual_seed(seed)
    model = get_spec(cfg.model.name).build_model_fn(cfg)
    # adaLN-Zero starts every output at zero; random weights make labels and guidance matter.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


def write_ckpt(tmp_path, cfg, seed=0):
    ema, raw = tiny_model(cfg, seed), tiny_model(cfg, seed + 1)
    files = {"ema.safetensors": ema.state_dict(), "model.safetensors": raw.state_dict(),
             "config.yaml": yaml.safe_dump(cfg.to_dict(), sort_keys=False)}
    return save_checkpoint(tmp_path / "run", 1, files), ema


def sample_cli(ckpt, *args):
    return main(["sample", "--ckpt", str(ckpt), "--steps", "3", "--device", "cpu", "--no-progress", *args])


@pytest.fixture(scope="module")
def digits_ckpt(tmp_path_factory):
    return write_ckpt(tmp_path_factory.mktemp("digits"), tiny_cfg())


@pytest.mark.parametrize("sampler", ["ddpm", "ddim"])
def test_cli_writes_grid(digits_ckpt, tmp_path, sampler):
    out = tmp_path / "grid.png"
    assert sample_cli(digits_ckpt[0], "--class-labels", "1", "2", "3", "--sampler", sampler, "--nrow", "2", "--out", str(out)) == 0
    img = Image.open(out)
    assert img.mode == "L" and img.size == (2 * (8 + 2) + 2, 2 * (8 + 2) + 2)


def test_cli_is_deterministic_per_seed(digits_ckpt, tmp_path):
    def grid(seed, name):
        assert sample_cli(digits_ckpt[0], "--class-names", "7", "3", "--sampler", "ddpm", "--seed", str(seed),
                          "--out", str(tmp_path / name)) == 0
        return np.asarray(Image.open(tmp_path / name))

    first = grid(0, "a.png")
    assert np.array_equal(first, grid(0, "b.png"))
    assert not np.array_equal(first, grid(1, "c.png"))


def test_cli_unknown_class_name_is_one_line(digits_ckpt, capsys):
    assert sample_cli(digits_ckpt[0], "--class-names", "seven") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dit sample: error: unknown class name 'seven'") and "\n" not in err


def test_guidance_interval_on_a_diffusion_run(digits_ckpt, tmp_path, capsys):
    assert sample_cli(digits_ckpt[0], "--class-labels", "1", "--guidance-interval", "0.8", "0.2",
                      "--out", str(tmp_path / "g.png")) == 2
    err = capsys.readouterr().err.strip()
    assert "--guidance-interval must satisfy 0 <= sigma_lo < sigma_hi" in err and "\n" not in err
    assert not (tmp_path / "g.png").exists()
    model, cfg = S.load_model(digits_ckpt[0])
    full = S.sample_latents(model, cfg, [1, 2], steps=3, seed=4)
    # (0, inf] holds every noise level: the same samples, bit for bit, as guiding every step.
    assert torch.equal(S.sample_latents(model, cfg, [1, 2], steps=3, seed=4, guidance_interval=(0, float("inf"))), full)
    assert not torch.equal(S.sample_latents(model, cfg, [1, 2], steps=3, seed=4, guidance_interval=(0, 0.5)), full)


def test_sampler_flags_are_the_objectives_to_accept():
    from dit_trainer.sample.cli import sampler_options
    from dit_trainer.sample.settings import SampleSettings

    class Tolerant:  # an objective whose one sampler takes atol only
        name = "tolerant"

        def sampler_option_names(self, sampler):
            return ("atol",)

    settings = SampleSettings("x", sampler_options=(("atol", 1e-3),))
    assert sampler_options(settings, Tolerant(), "any") == {"atol": 1e-3}
    with pytest.raises(ConfigError, match="^--sde-method do\\(es\\) not apply to --sampler any$"):
        sampler_options(SampleSettings("x", sampler_options=(("sde_method", "Heun"),)), Tolerant(), "any")


def test_ema_weights_are_loaded(digits_ckpt):
    model, cfg = S.load_model(digits_ckpt[0])
    assert cfg.model.options["depth"] == 2 and cfg.data.path == "digits"
    for (k, a), b in zip(model.state_dict().items(), digits_ckpt[1].state_dict().values()):
        assert torch.equal(a, b), k
    assert S.load_model(digits_ckpt[0].parent.parent)[1].model.name == "DiT-S/4"  # a run dir: newest checkpoint


def test_cfg_equals_manual_doubling():
    cfg = tiny_cfg()
    model = tiny_model(cfg)
    labels, scale, n = torch.tensor([1, 4, 9]), 3.0, 3
    got = S.sample_latents(model, cfg, labels, cfg_scale=scale, sampler="ddim", steps=4, seed=5)

    def guided(x, t, y):
        cond, uncond = model(x, t, y), model(x, t, torch.full_like(y, 10))
        eps = uncond[:, :1] + scale * (cond[:, :1] - uncond[:, :1])
        return torch.cat([eps, cond[:, 1:]], dim=1)

    noise = torch.randn((n, 1, 8, 8), generator=torch.Generator().manual_seed(5))
    want = diffusion_from_config(cfg, "ddim4").ddim_sample_loop(guided, (n, 1, 8, 8), noise=noise, clip_denoised=True,
                                                         model_kwargs={"y": labels})
    assert torch.allclose(got, want, atol=1e-5)
    assert not torch.allclose(got, S.sample_latents(model, cfg, labels, cfg_scale=1.0, sampler="ddim", steps=4, seed=5))


def test_batches_rng_and_mode():
    cfg = tiny_cfg()
    model = tiny_model(cfg).train()
    seen = []
    model.x_embedder.register_forward_pre_hook(lambda m, args: seen.append(len(args[0])))
    state = torch.get_rng_state()
    a = S.sample_latents(model, cfg, [1, 2], cfg_scale=1.0, sampler="ddpm", steps=2)
    assert set(seen) == {2}  # no doubled batch without guidance
    seen.clear()
    b = S.sample_latents(model, cfg, [1, 2], cfg_scale=2.0, sampler="ddpm", steps=2)
    assert set(seen) == {4} and a.shape == b.shape == (2, 1, 8, 8)
    assert torch.equal(b, S.sample_latents(model, cfg, [1, 2], cfg_scale=2.0, sampler="ddpm", steps=2))
    assert torch.equal(state, torch.get_rng_state()) and model.training
    with pytest.raises(ConfigError, match="steps"):
        S.sample_latents(model, cfg, [1], steps=0)


def test_npz(digits_ckpt, tmp_path):
    path = tmp_path / "fid" / "samples.npz"
    assert sample_cli(digits_ckpt[0], "--npz", str(path), "--num-samples", "5", "--batch-size", "2", "--steps", "2") == 0
    with np.load(path) as data:
        assert data["arr_0"].shape == (5, 8, 8, 3) and data["arr_0"].dtype == np.uint8
        assert data["arr_1"].shape == (5,) and data["arr_1"].max() < 10
    assert not (tmp_path / "samples.png").exists()


def test_uint8_and_grid(tmp_path):
    x = torch.tensor([-1.0, 0.0, 1.0, 2.0]).view(1, 1, 2, 2).repeat(3, 3, 1, 1)
    u = S.to_uint8(x)
    assert u.shape == (3, 2, 2, 3) and u.dtype == np.uint8 and u[0, :, :, 0].ravel().tolist() == [0, 128, 255, 255]
    assert Image.open(S.save_grid(u, tmp_path / "g.png", nrow=8)).size == (3 * 4 + 2, 6)
    with pytest.raises(ConfigError, match="no VAE"):
        S.to_images(torch.zeros(1, 4, 2, 2))
    assert S.to_images(torch.zeros(1, 4, 2, 2), strict=False).shape == (1, 3, 2, 2)


def test_grid_from_trainer_leaves_rng_alone(tmp_path):
    from dit_trainer.train import DiTTrainer

    cfg = tiny_cfg()
    cfg.output_dir = str(tmp_path)
    trainer = DiTTrainer(cfg)
    cpu, gen = torch.get_rng_state(), trainer.generator.get_state()
    path = trainer.save_sample_grid(tmp_path / "s.png", steps=2)
    assert Image.open(path).size == (8 + 4, 10 * (8 + 2) + 2)  # ten classes, one row each
    assert torch.equal(cpu, torch.get_rng_state()) and torch.equal(gen, trainer.generator.get_state())


def test_vae_decode_path(tmp_path):
    diffusers = pytest.importorskip("diffusers")
    shards = pytest.importorskip("dit_trainer.data.shards")
    vae_dir = tmp_path / "vae"
    torch.manual_seed(0)
    diffusers.AutoencoderKL(block_out_channels=(8, 16), layers_per_block=1, latent_channels=4, norm_num_groups=8,
                            sample_size=32, down_block_types=("DownEncoderBlock2D",) * 2,
                            up_block_types=("UpDecoderBlock2D",) * 2).save_pretrained(vae_dir)
    data = tmp_path / "latents"
    data.mkdir()
    shards.write_manifest(str(data), count=0, latent_shape=[4, 8, 8], dtype="float16", num_classes=10,
                          class_names=[f"c{i}" for i in range(10)], vae=str(vae_dir), scaling_factor=0.5,
                          image_size=16, flips=False, posterior="sample", shards=[])
    cfg = tiny_cfg(in_channels=4, data_path=str(data))
    assert S.vae_source(cfg) == (str(vae_dir), 0.5, None)
    assert S.vae_source(cfg, override="other")[0] == "other"

    ckpt, _ = write_ckpt(tmp_path, cfg)
    out = tmp_path / "grid.png"
    assert sample_cli(ckpt, "--class-names", "C3", "c5", "--sampler", "ddim", "--out", str(out)) == 0
    img = Image.open(out)
    assert img.mode == "RGB" and img.size == (2 * (16 + 2) + 2, 16 + 4)  # latents 8×8 decode to 16×16

    vae, sf, shift = S.load_decoder(cfg)
    z = torch.randn(2, 4, 8, 8)
    with torch.no_grad():
        want = vae.decode(z / 0.5).sample.clamp(-1, 1)
    assert sf == 0.5 and torch.allclose(S.decode(z, vae, sf, shift), want, atol=1e-5)


def test_original_weights_file(tmp_path):
    from dit_trainer.models import DiT, ModelSpec, list_specs, register_spec

    name = "DiT-test-tiny/4"
    if name not in list_specs():
        register_spec(name, ModelSpec(name, lambda cfg: DiT(input_size=cfg.model.input_size, patch_size=4, hidden_size=64,
                                                             depth=1, num_heads=4, num_classes=cfg.model.num_classes)))
    cfg = Config()
    cfg.model.name, cfg.model.input_size, cfg.model.num_classes = name, 8, 10
    path = tmp_path / "DiT-tiny.pt"
    torch.save({"model": tiny_model(cfg, 1).state_dict(), "ema": tiny_model(cfg, 2).state_dict()}, path)
    with pytest.raises(ConfigError, match="--model"):
        S.load_model(path)
    model, got = S.load_model(path, name, image_size=64, num_classes=10)
    assert got.model.input_size == 8 and got.data.vae == S.DEFAULT_VAE and S.vae_source(got)[1] == 0.18215
    assert torch.equal(model.y_embedder.embedding_table.weight, tiny_model(cfg, 2).y_embedder.embedding_table.weight)


SAMPLE_THEN_ASK = r"""
import sys
from dit_trainer.cli import main
from dit_trainer.host_memory import freed_memory_kept
assert main(["sample", "--ckpt", sys.argv[1], "--steps", "2", "--device", "cpu", "--no-progress", "--class-labels", "1",
             "--out", sys.argv[2], *sys.argv[3:]]) == 0
print(freed_memory_kept())
"""


@pytest.mark.skipif(not glibc_malloc(), reason="mallopt is glibc's; elsewhere keep_freed_memory is a no-op")
def test_cli_keeps_freed_memory_on_cpu(digits_ckpt, tmp_path):
    # A fresh process: the setting is process-wide, and this one has had trainers apply it.
    out = subprocess.run([sys.executable, "-c", SAMPLE_THEN_ASK, str(digits_ckpt[0]), str(tmp_path / "g.png")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == "True"


def test_steps_with_an_adaptive_ode_method_is_noted(capsys):
    # dopri5 (SiT's default) takes --steps as output times only; a fixed-step method takes it as steps.
    from dit_trainer.config import Config
    from dit_trainer.sample.cli import note_adaptive_steps
    from dit_trainer.sample.settings import SampleSettings

    cfg = Config()  # transport.ode_method: dopri5
    note_adaptive_steps(SampleSettings("x", steps=10), "ode", cfg)
    err = capsys.readouterr().err
    assert "--steps 10 sets output times only: dopri5 chooses its own steps" in err and err.count("\n") == 1
    for args, sampler in ((SampleSettings("x", steps=10, sampler_options=(("ode_method", "euler"),)), "ode"),
                          (SampleSettings("x"), "ode"), (SampleSettings("x", steps=10), "sde")):
        note_adaptive_steps(args, sampler, cfg)
        assert capsys.readouterr().err == ""


def test_a_guide_weight_without_a_guide_is_refused_not_ignored(digits_ckpt, tmp_path, capsys):
    assert sample_cli(digits_ckpt[0], "--class-labels", "1", "--guide-scale", "3", "--out", str(tmp_path / "g.png")) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dit sample: error: --guide-scale 3 needs a guide") and "\n" not in err
    assert not (tmp_path / "g.png").exists()
