"""The issue's acceptance path: `dit convert --from dit-pt CKPT.pt --to diffusers OUT --model DiT-S/2
--vae VAE_DIR`, then diffusers' DiTPipeline on OUT computes the released DiT under diffusers' convention."""

import torch

from tests.convert.convert_helpers import build_with_convention, randomize


def test_release_pt_to_diffusers_pipeline(tmp_path, vae_dir):
    from diffusers import DiTPipeline

    from dit_trainer.cli import main
    from dit_trainer.models.dit import DiT_S_2

    released = randomize(DiT_S_2(input_size=4), seed=3, std=0.05)  # full DiT-S/2 width and depth, 2x2 tokens
    torch.save(released.state_dict(), tmp_path / "DiT-S-2.pt")
    assert main(["convert", "--from", "dit-pt", str(tmp_path / "DiT-S-2.pt"), "--to", "diffusers",
                 str(tmp_path / "out"), "--model", "DiT-S/2", "--vae", vae_dir]) == 0

    pipe = DiTPipeline.from_pretrained(str(tmp_path / "out"))
    assert pipe.get_label_ids(["golden retriever"]) == [207]
    # The export carries our MLP eps as norm_eps, so only diffusers' timestep frequencies differ.
    ours = build_with_convention({"name": "DiT-S/2", "input_size": 4, "timestep_freq_shift": 1})
    ours.load_state_dict(released.state_dict())
    x = torch.randn(2, 4, 4, 4, generator=torch.Generator().manual_seed(0))
    t, y = torch.tensor([10, 900]), torch.tensor([207, 1000])
    with torch.no_grad():
        theirs = pipe.transformer(x, timestep=t, class_labels=y).sample
        mine = ours.eval()(x, t, y)
    assert float((mine - theirs).norm() / theirs.norm()) < 1e-4
