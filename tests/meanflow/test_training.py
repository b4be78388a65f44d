"""MeanFlow in the trainer: a SiT release starts it as that flow model, resume is bitwise, activation
checkpointing trains the eager run's steps, and what it cannot run is one line."""

import shutil

import pytest
import torch
from safetensors.torch import load_file
from tests.parallel._common import SCALE_RANGE, TinyLatents, learns, read_losses, tiny_config

from dit_trainer.errors import ConfigError
from dit_trainer.models import get_spec
from dit_trainer.train import DiTTrainer
from dit_trainer.train import preflight

def meanflow_config(out, steps=4, train=None, **sections):
    """The layouts' tiny MeanFlow run (a 2-block SiT, 8x8x4 latents, batch 8), `steps` long."""
    return tiny_config(out, kind="mf", train={"max_steps": steps, **(train or {})}, checkpoint={"save_steps": 2},
                       **sections)


def train(cfg):
    trainer = DiTTrainer(cfg, dataset=TinyLatents())
    trainer.train()
    return trainer


def test_a_released_sit_starts_a_meanflow_model_as_that_flow_model(tmp_path):
    """`model.weights_path` to a release-layout SiT file: every tensor loads, the interval embedder is added at
    zero, and at h = 0 the MeanFlow model's output is the release's velocity."""
    torch.manual_seed(0)
    # SiT-S's release width (its heads known from the tensors) at depth 1
    release = get_spec("SiT-S/2").build_model_fn({"input_size": 8, "in_channels": 4, "num_classes": 10, "depth": 1})
    with torch.no_grad():
        for key, p in release.named_parameters():
            if key != "pos_embed":
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(key))) * 0.05)
    path = tmp_path / "SiT-tiny.pt"
    torch.save(release.state_dict(), path)
    cfg = {"output_dir": str(tmp_path / "run"), "objective": "meanflow", "data": {"num_workers": 0},
           "model": {"name": "SiT-S/2", "depth": 1, "weights_path": str(path)},
           "train": {"device": "cpu", "mixed_precision": "fp32", "global_batch_size": 8, "max_steps": 1},
           "logging": {"progress": False, "tensorboard": False}}
    trainer = DiTTrainer(cfg, dataset=TinyLatents())
    model = trainer.model.eval()
    assert trainer.cfg.model.name == "SiT-S/2" and trainer.cfg.model.learn_sigma
    assert all(bool((p == 0).all()) for k, p in model.state_dict().items() if k.startswith("h_embedder.mlp.2"))
    g = torch.Generator().manual_seed(1)
    x, t, y = torch.randn(3, 4, 8, 8, generator=g), torch.rand(3, generator=g), torch.tensor([0, 4, 9])
    with torch.no_grad():
        assert torch.equal(model(x, t, y, h=torch.zeros(3)), release.eval()(x, t, y))


@pytest.mark.parametrize("kind", ["dit", "ldit"])
def test_dit_and_large_dit_train_as_meanflow(tmp_path, kind):
    """The other families (DiT with its learned-sigma half, Large-DiT) take MeanFlow steps and learn h (from
    the third: adaLN-Zero's zero output layer, then zero modulation, pass no gradient to any embedder before)."""
    from dit_trainer.config import build_config

    d = tiny_config(tmp_path / kind, kind=kind, train={"max_steps": 3}).to_dict()
    d["objective"] = "meanflow"
    trainer = DiTTrainer(build_config(d), dataset=TinyLatents())
    out, changed = learns(trainer, ["h_embedder.mlp.2"], 3)
    assert torch.isfinite(torch.tensor(out["loss"])) and out["grad_norm"] > 0 and changed


@pytest.mark.parametrize("meanflow", [{}, SCALE_RANGE], ids=["official", "scale-range"])
def test_resume_is_bitwise(tmp_path, meanflow):
    whole = train(meanflow_config(tmp_path / "whole", meanflow=meanflow))
    part = tmp_path / "part"
    (part / "checkpoints").mkdir(parents=True)
    shutil.copytree(tmp_path / "whole" / "checkpoints" / "step-00000002", part / "checkpoints" / "step-00000002")
    resumed = train(meanflow_config(part, meanflow=meanflow))
    assert resumed.step == whole.step == 4
    for name in ("model", "ema"):
        a = load_file(tmp_path / "whole" / "checkpoints" / "step-00000004" / f"{name}.safetensors")
        b = load_file(part / "checkpoints" / "step-00000004" / f"{name}.safetensors")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    assert read_losses(part)[3] == read_losses(tmp_path / "whole")[3]


def test_activation_checkpointing_trains_the_eager_steps(tmp_path):
    """Selective and full AC give the eager run's losses and gradient norms. (Compile too, but its first
    step costs a minute on two cores: `python benchmarks/meanflow_step.py --check-compile` checks it.)"""
    eager = meanflow_config(tmp_path / "eager", steps=2)
    train(eager)
    ref = {k: read_losses(tmp_path / "eager", k) for k in ("loss", "grad_norm")}
    for name, options in (("selective", {"activation_checkpointing": "selective"}),
                          ("full", {"activation_checkpointing": "full"})):
        train(meanflow_config(tmp_path / name, steps=2, train=options))
        for key in ("loss", "grad_norm"):
            got = read_losses(tmp_path / name, key)
            assert sorted(got) == [1, 2]
            for s in got:
                assert abs(got[s] - ref[key][s]) <= 1e-5 * abs(ref[key][s]), f"{name} {key} step {s}"


@pytest.mark.parametrize("sections,match", [
    ({"parallel": {"pp": 2, "dp_shard": 1}}, "pipeline parallelism"),
    ({"parallel": {"tp": 2, "dp_shard": 1}}, "tensor parallelism"),
    ({"repa": {"enabled": True, "encoder_weights": "random"}}, "repa.enabled"),
    ({"meanflow": {"jvp": "graph"}, "train": {"activation_checkpointing": "full"}}, "activation_checkpointing"),
    ({"eval": {"every": 10, "cfg_scale": 2.0}}, "eval.cfg_scale 2: objective meanflow samples unguided"),
    ({"eval": {"every": 10, "guide": "50%", "guide_scale": 2.0}}, "eval.guide: objective meanflow samples unguided"),
    ({"eval": {"every": 10}, "sample": {"cfg_scale": None},
      "meanflow": {"omega_range": [1.5, 2.0], "omega": 1.5, "kappa": 0.0}},
     "eval.cfg_scale 1 is outside the scales this run trained on"),
])
def test_what_meanflow_cannot_run_is_one_line(tmp_path, sections, match):
    from dit_trainer.config import build_config

    base = meanflow_config(tmp_path / "run").to_dict()
    for name, values in sections.items():
        base[name].update(values)
    with pytest.raises(ConfigError, match=match):
        build_config(base)


def test_graph_jvp_is_refused_under_ddp(tmp_path):
    class DDP:  # two replicas, nothing sharded: what DDP's second step fails under (torch 2.13)
        ddp_enabled, tp_enabled, pp_enabled = True, False, False

        def local_batch_size(self, n):
            return n // 2

    cfg = meanflow_config(tmp_path / "run", meanflow={"jvp": "graph"})
    with pytest.raises(ConfigError, match="meanflow.jvp graph does not run under DDP"):
        preflight.check_layout(cfg, DDP())
    cfg.meanflow.jvp = "separate"
    preflight.check_layout(cfg, DDP())


@pytest.mark.parametrize("meanflow", [{"kappa": 0.5, "omega": 1.5}, SCALE_RANGE],
                         ids=["official-guidance", "scale-range"])
def test_pixart_trains_as_meanflow_on_captions(tmp_path, meanflow):
    """The text-conditioned family takes MeanFlow steps: its interval (and scale) embedders start at zero beside
    the release's tensors, the guided target's unconditional velocity is the null caption's, and h is learnt."""
    from tests.parallel._common import TinyCaptions

    cfg = tiny_config(tmp_path / "run", kind="pixart", objective="meanflow", train={"max_steps": 3},
                      meanflow={"ratio": 0.5, **meanflow})
    trainer = DiTTrainer(cfg, dataset=TinyCaptions())
    state = trainer.model.state_dict()
    names = ("h_embedder", "w_embedder") if "omega_range" in meanflow else ("h_embedder",)
    heads = [f"{n}.mlp.2" for n in names]
    assert all(bool((v == 0).all()) for k, v in state.items() if k.startswith(tuple(heads)))
    assert ("w_embedder.mlp.2.weight" in state) == ("omega_range" in meanflow)
    out, changed = learns(trainer, heads, 3)
    assert torch.isfinite(torch.tensor(out["loss"])) and out["grad_norm"] > 0 and changed
    # Sampling the captions: MeanFlow's steps, the caption (and scale) as the network's inputs.
    from dit_trainer.meanflow.sampler import sample_meanflow
    from dit_trainer.sample.sampling import sample_conditioned

    model, data = trainer.model.eval(), TinyCaptions()
    cond = {"text_embeds": data.text_embeds[:2].float(), "text_mask": data.text_mask[:2]}
    got = sample_conditioned(model, trainer.cfg, trainer.condition, cond, cfg_scale=1.5 if "omega_range" in meanflow
                             else 1.0, steps=2, seed=5)
    scale = {"w": torch.full((2,), 1.5)} if "omega_range" in meanflow else {}
    z = torch.randn((2, 4, 8, 8), generator=torch.Generator().manual_seed(5))
    want = sample_meanflow(lambda x, t, **kw: model(x, t, **kw), z, [1.0, 0.5, 0.0], {**cond, **scale})
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_family_without_the_interval_input_is_refused_in_one_line():
    """A registered family whose builder adds no interval embedder stops a MeanFlow run before its first step."""
    from dit_trainer.config import build_config
    from dit_trainer.models.interval import check_interval

    cfg = build_config({"objective": "meanflow", "model": {"name": "SiT-S/2", "input_size": 8, "depth": 1}})
    with pytest.raises(ConfigError, match="needs the interval input h, which model Custom") as err:
        check_interval(torch.nn.Linear(1, 1), cfg, "Custom")
    assert "\n" not in str(err.value)


def test_the_null_condition_the_guided_target_needs_is_checked_on_the_runs_own_dropout(tmp_path):
    from tests.parallel._common import TinyCaptions

    with pytest.raises(ConfigError, match="model.class_dropout_prob 0 never trains") as err:
        DiTTrainer(meanflow_config(tmp_path / "class", model={"class_dropout_prob": 0.0}))
    assert "\n" not in str(err.value)
    guided = {"omega": 1.5, "kappa": 0.5}
    with pytest.raises(ConfigError, match="data.caption_dropout_prob 0 never trains"):
        DiTTrainer(tiny_config(tmp_path / "text", kind="pixart", objective="meanflow", meanflow=guided,
                               data={"caption_dropout_prob": 0.0}), dataset=TinyCaptions())
    # A text model drops captions, not labels: its class_dropout_prob says nothing.
    DiTTrainer(tiny_config(tmp_path / "ok", kind="pixart", objective="meanflow", meanflow=guided,
                           model={"class_dropout_prob": 0.0}), dataset=TinyCaptions())


def test_meanflow_gathers_float32_weights_under_mixed_precision_and_its_sampler_can_be_named(tmp_path):
    from dit_trainer.config import build_config
    from dit_trainer.meanflow import MeanFlowObjective
    from dit_trainer.objective import Objective
    from dit_trainer.train.choices import gathered_dtype

    assert gathered_dtype(MeanFlowObjective(), torch.bfloat16) == torch.float32  # its JVP's calls stay float32
    assert gathered_dtype(Objective(), torch.bfloat16) == torch.bfloat16
    assert gathered_dtype(Objective(), None) == torch.float32
    base = meanflow_config(tmp_path / "run").to_dict()
    base["sample"]["sampler"] = "meanflow"
    assert build_config(base).sample.sampler == "meanflow"
