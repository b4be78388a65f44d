"""`dit plan` prices REPA: the projector as trained weights of the head, the encoder's forward in
the step time and its replicated weights in every rank's memory."""

from dit_trainer.config import build_config
from dit_trainer.encoders import encoder_param_count
from dit_trainer.plan.memory import Numerics, rank_memory
from dit_trainer.plan.search import model_costs
from dit_trainer.plan.layouts import Layout


def test_plan_counts_the_projector_and_the_encoder():
    plain = build_config({"model": {"name": "SiT-XL/2"}})
    repa = build_config({"model": {"name": "SiT-XL/2"}, "repa": {"enabled": True}})
    a, b = model_costs(plain), model_costs(repa)
    projector = 1152 * 2048 + 2048 + 2048 * 2048 + 2048 + 2048 * 768 + 768
    assert b.trainable - a.trainable == projector
    assert b.replicated_bytes == 4 * encoder_param_count("dinov2_vitb14") > 300e6  # ViT-B/14's 86M in fp32
    assert b.edge_flops > a.edge_flops
    layout = Layout(dp_shard=8)
    mem_a = rank_memory(a, layout, 256, Numerics.of("bf16", "cuda"))[0]
    mem_b = rank_memory(b, layout, 256, Numerics.of("bf16", "cuda"))[0]
    assert mem_b.params - mem_a.params >= b.replicated_bytes


def test_plan_offers_no_pipelined_layout_with_repa():
    from dit_trainer.plan.hardware import load_hardware
    from dit_trainer.plan.search import Request, plan_layouts

    cfg = build_config({"model": {"name": "SiT-XL/2"}, "repa": {"enabled": True}})
    plans = plan_layouts(Request(cfg, gpus=4, gpus_per_node=4, hardware=load_hardware("h100")))
    assert plans and all(p.layout.pp == 1 for p in plans)
