"""Sampling a text-conditioned model from prompts: the library call (`sample_prompts`) and `dit sample
--prompt` / `--prompts`, `dit sample-ddp --prompts` on one process; guidance's unconditional half is the
encoding of "" or the negative prompt's; prompts for a class model, labels for a text model, and bad
prompt files are one line each (exit 2)."""

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("diffusers")

from dit_trainer.cli import main  # noqa: E402
from dit_trainer.errors import ConfigError  # noqa: E402

PROMPTS = ["a cat", "two dogs"]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    """(checkpoint folder of a tiny random PixArt with a tiny T5 and VAE, its loaded model, cfg and encoder)."""
    from dit_trainer.sample.loading import load_model
    from dit_trainer.sample.prompts import run_text_encoder
    from tests.text_helpers import save_tiny_pixart_run, save_tiny_t5
    from tests.train.trainer_helpers import save_tiny_vae

    root = tmp_path_factory.mktemp("text_run")
    run = save_tiny_pixart_run(root / "run", save_tiny_vae(root / "vae"), save_tiny_t5(root / "t5"))
    model, cfg = load_model(run)
    return run, model, cfg, run_text_encoder(cfg, folder=run)


def _sample(text_run, **kw):
    from dit_trainer.sample.prompts import sample_prompts

    _, model, cfg, encoder = text_run
    kw = {"cfg_scale": 4.0, "sampler": "ddim", "steps": 3, "seed": 1, **kw}
    return sample_prompts(model, cfg, None, encoder, PROMPTS, **kw)


def test_prompt_sampling_is_deterministic_and_follows_the_prompt(text_run):
    first = _sample(text_run)
    assert first.shape == (2, 4, 8, 8) and torch.equal(first, _sample(text_run))
    assert not torch.equal(first, _sample(text_run, seed=2))
    from dit_trainer.sample.prompts import sample_prompts

    _, model, cfg, encoder = text_run
    swapped = sample_prompts(model, cfg, None, encoder, PROMPTS[::-1], cfg_scale=4.0, sampler="ddim", steps=3, seed=1)
    assert not torch.equal(first, swapped)  # same noise, other captions


def _uncond_half(text_run, **kw):
    """The text_embeds of the unconditional half of the first guided model call."""
    _, model, _, _ = text_run
    seen, guided = [], model.forward_with_cfg

    def spy(x, t, cfg_scale, **cond):
        seen.append(cond["text_embeds"].clone())
        return guided(x, t, cfg_scale, **cond)

    model.forward_with_cfg = spy
    try:
        out = _sample(text_run, **kw)
    finally:
        del model.forward_with_cfg
    return out, seen[0][len(PROMPTS):]


def test_the_unconditional_half_is_the_empty_caption_or_the_negative_prompt(text_run):
    encoder = text_run[3]
    plain, uncond = _uncond_half(text_run)
    assert torch.equal(uncond, encoder.encode([""] * 2)["text_embeds"])  # diffusers' default negative prompt ""
    empty, uncond_empty = _uncond_half(text_run, negative_prompt="")
    assert torch.equal(empty, plain) and torch.equal(uncond_empty, uncond)
    negative, uncond_neg = _uncond_half(text_run, negative_prompt="blue")
    assert torch.equal(uncond_neg, encoder.encode(["blue"] * 2)["text_embeds"])
    assert not torch.allclose(negative, plain)
    # Without guidance there is no unconditional half: the negative prompt changes nothing.
    assert torch.equal(_sample(text_run, cfg_scale=1.0, negative_prompt="blue"), _sample(text_run, cfg_scale=1.0))


def test_micro_conditions_are_the_image_size(text_run):
    from dit_trainer.sample.prompts import sample_prompts
    from tests.models.pixart.pixart_helpers import tiny_pixart

    model = tiny_pixart(micro=True, text_hidden_size=32)
    seen = []
    model.register_forward_pre_hook(lambda m, a, k: seen.append(k), with_kwargs=True)
    sample_prompts(model, None, None, text_run[3], PROMPTS, cfg_scale=1.0, sampler="ddim", steps=2, image_size=16)
    assert torch.equal(seen[0]["resolution"], torch.full((2, 2), 16.0))
    assert torch.equal(seen[0]["aspect_ratio"], torch.ones(2, 1))


def test_guide_takes_the_conditional_rows(text_run):
    """Autoguidance on a text model: the guide is called with the prompts' own caption rows."""
    _, model, cfg, encoder = text_run
    calls = []

    def guide(x, t, **cond):
        calls.append(cond)
        return model(x, t, **cond)

    _sample(text_run, cfg_scale=2.0, guide=guide, guide_scale=2.0)
    assert torch.equal(calls[0]["text_embeds"], encoder.encode(PROMPTS)["text_embeds"])


def test_sample_prompt_grid_and_npz(text_run, tmp_path):
    run = text_run[0]
    args = ["sample", "--ckpt", run, "--sampler", "ddim", "--steps", "2", "--no-progress", "--device", "cpu"]
    assert main([*args, "--prompt", *PROMPTS, "--per-prompt", "2", "--out", str(tmp_path / "grid.png")]) == 0
    from PIL import Image

    assert Image.open(tmp_path / "grid.png").size[0] > 2 * 16
    (tmp_path / "prompts.txt").write_text("a cat\n\n  two dogs \none digit\n")
    assert main([*args, "--prompts", str(tmp_path / "prompts.txt"), "--npz", str(tmp_path / "s.npz"),
                 "--num-samples", "6", "--batch-size", "4", "--negative-prompt", "blue"]) == 0
    with np.load(tmp_path / "s.npz") as f:
        assert f["arr_0"].shape == (6, 16, 16, 3) and sorted(f["arr_1"].tolist()) == [0, 0, 1, 1, 2, 2]


def test_sample_ddp_over_a_prompt_file(text_run, tmp_path, monkeypatch, capsys):
    """One process: the prompts covered evenly, the chunks those of the library call; an interrupted batch
    resumes to the same images, and another prompt file over its chunks is refused in one line."""
    import dit_trainer.sample.fid_batch as writer
    from dit_trainer.sample.decode import load_decoder, to_images
    from dit_trainer.sample.images import adm_images
    from dit_trainer.sample.prompts import sample_prompts

    run, model, cfg, encoder = text_run
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a cat\ntwo dogs\none digit\n")

    def ddp(npz):
        return main(["sample-ddp", "--ckpt", run, "--prompts", str(prompts), "--npz", str(tmp_path / npz),
                     "--num-samples", "6", "--batch-size", "3", "--sampler", "ddim", "--steps", "2", "--no-progress",
                     "--device", "cpu"])

    assert ddp("f.npz") == 0
    with np.load(tmp_path / "f.npz") as f:
        images, labels = f["arr_0"], f["arr_1"]
    assert sorted(labels.tolist()) == [0, 0, 1, 1, 2, 2]
    names = ["a cat", "two dogs", "one digit"]
    first = sample_prompts(model, cfg, None, encoder, [names[i] for i in labels[:3]], cfg_scale=1.5, sampler="ddim",
                           steps=2, seed=writer.chunk_seed(0, 0))
    assert np.array_equal(adm_images(to_images(first, *load_decoder(cfg))), images[:3])
    save = writer._save_chunk

    def stop_after_one(path, *chunk):
        save(path, *chunk)
        raise KeyboardInterrupt

    monkeypatch.setattr(writer, "_save_chunk", stop_after_one)
    assert ddp("again.npz") == 130
    monkeypatch.setattr(writer, "_save_chunk", save)
    prompts.write_text("a cat\ntwo dogs\none digit\nred\n")
    capsys.readouterr()
    assert ddp("again.npz") == 2  # another prompt set is another batch, not the one the chunks began
    err = capsys.readouterr().err.strip()
    assert "prompts_sha256" in err and "num_prompts 3 then, 4 now" in err and "\n" not in err
    prompts.write_text("a cat\ntwo dogs\none digit\n")
    assert ddp("again.npz") == 0
    with np.load(tmp_path / "again.npz") as f:
        assert np.array_equal(f["arr_0"], images)


@pytest.fixture(scope="module")
def class_run(tmp_path_factory):
    """A checkpoint folder of a tiny class-conditional DiT (no VAE: refused before one would load)."""
    from dit_trainer.convert import Bundle, write
    from dit_trainer.convert.model_config import build_dit
    from tests.convert.convert_helpers import TINY

    model = build_dit(TINY)
    return str(write("ours", Bundle(state_dict=model.state_dict(), model=TINY), tmp_path_factory.mktemp("c") / "ckpt"))


def _one_line_error(capsys, argv, *words):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and all(w in err for w in words), err


def test_conditions_the_checkpoint_does_not_take_are_refused_in_one_line(text_run, class_run, tmp_path, capsys):
    base = ["sample", "--steps", "2", "--no-progress", "--device", "cpu", "--out", str(tmp_path / "g.png")]
    _one_line_error(capsys, [*base, "--ckpt", text_run[0], "--class-labels", "1"], "text-conditioned", "--prompt")
    _one_line_error(capsys, [*base, "--ckpt", text_run[0]], "text-conditioned", "--prompts FILE")
    _one_line_error(capsys, [*base, "--ckpt", class_run, "--prompt", "a cat"], "class-conditional", "--prompt",
                    "--class-labels")
    _one_line_error(capsys, [*base, "--ckpt", class_run, "--class-labels", "1", "--negative-prompt", "x"],
                    "class-conditional", "--negative-prompt")
    assert not (tmp_path / "g.png").exists()


@pytest.mark.parametrize("content, words", [(b"", "holds no prompt"), (b"a cat\n\xff\xfe\n", "not UTF-8"),
                                            (b"a\x00b\n", "NUL byte")])
def test_bad_prompt_files_are_one_line(text_run, tmp_path, capsys, content, words):
    bad = tmp_path / "p.txt"
    bad.write_bytes(content)
    _one_line_error(capsys, ["sample", "--ckpt", text_run[0], "--prompts", str(bad), "--out", str(tmp_path / "g.png")],
                    str(bad), words)


def test_a_missing_text_encoder_names_the_flag(text_run, tmp_path):
    from dit_trainer.sample.prompts import run_text_encoder

    cfg = text_run[2]
    with pytest.raises(ConfigError, match=r"^--text-encoder: .*does not exist"):
        run_text_encoder(cfg, override=str(tmp_path / "missing"))
    bare = type(cfg)()
    with pytest.raises(ConfigError, match="records no text encoder.*--text-encoder"):
        run_text_encoder(bare)


def test_a_prompt_no_tokenizer_takes_is_one_line():
    from dit_trainer.sample.prompt_text import check_prompts

    assert check_prompts(["  a cat  "]) == ["a cat"]
    # What a command line's undecodable bytes become (surrogateescape), and a NUL.
    for bad in ("caf\udce9", "a\x00b"):
        with pytest.raises(ConfigError, match="prompts must be UTF-8 strings without NUL bytes") as err:
            check_prompts([bad])
        assert "\n" not in str(err.value)


def test_prompts_are_encoded_at_the_token_count_training_uses(text_run):
    import copy

    from dit_trainer.data.loader import caption_tokens
    from dit_trainer.sample.prompts import run_text_encoder

    run, _, cfg, encoder = text_run
    assert cfg.data.text_max_length == 0 and encoder.max_length == caption_tokens(cfg) == 120  # PixArt-alpha's
    sigma = copy.deepcopy(cfg)
    sigma.model.name = "PixArt-Sigma-XL/2-512"
    assert run_text_encoder(sigma, folder=run).max_length == caption_tokens(sigma) == 300
    sigma.data.text_max_length = 77
    assert run_text_encoder(sigma, folder=run).max_length == 77


def test_a_prompt_cut_at_the_token_count_is_said(text_run, capsys):
    from dit_trainer.sample.prompts import sample_prompts

    _, model, cfg, encoder = text_run
    long_prompt = " ".join(["a red cat"] * (encoder.max_length + 5))
    sample_prompts(model, cfg, None, encoder, ["a cat", long_prompt], cfg_scale=1.0, sampler="ddim", steps=2)
    assert f"1 prompt(s) ran past {encoder.max_length} tokens and were cut there" in capsys.readouterr().err
    sample_prompts(model, cfg, None, encoder, ["a cat"], cfg_scale=1.0, sampler="ddim", steps=2)
    assert "ran past" not in capsys.readouterr().err
