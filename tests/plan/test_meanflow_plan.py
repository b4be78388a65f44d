"""`dit plan` prices a MeanFlow step as it runs (meanflow/costs.py): its extra network calls, float32 where
they leave autocast, FSDP's float32 gathers; flow matching and diffusion stay priced as before."""

from dataclasses import replace

import pytest
import torch

from dit_trainer.config import build_config
from dit_trainer.meanflow.costs import NO_EXTRA, Call, ObjectiveCost, moving_share, t_share
from dit_trainer.meanflow.demo import settings as demo_settings
from dit_trainer.meanflow.timesteps import sample_t_r
from dit_trainer.plan import load_hardware, make_request, plan_layouts
from dit_trainer.plan.layouts import Layout
from dit_trainer.plan.memory import Numerics, calls_transient, rank_memory
from dit_trainer.plan.search import model_costs, step_calls
from dit_trainer.plan.timing import Machine, _gather, step_time

TINY_SIT = {"name": "SiT-S/2", "depth": 2, "hidden_size": 64, "num_heads": 4, "input_size": 8, "num_classes": 10}
# The MeanFlow digits demo's settings.
DEMO = {k: v for k, v in demo_settings(0)["meanflow"].items() if k != "steps"}


def _cfg(model=TINY_SIT, meanflow=None, objective=None, batch=8, **train):
    data = {"output_dir": "unused", "model": dict(model),
            "train": {"global_batch_size": batch, "device": "cpu", "compile": "false", **train}}
    if meanflow is not None:
        data.update(objective="meanflow", meanflow=meanflow)
    elif objective:
        data["objective"] = objective
    return build_config(data)


def _unpriced(cfg, request, plan, objective=NO_EXTRA):
    """(time, memory) of `plan`'s layout priced directly with `objective`'s calls (none by default)."""
    numerics = Numerics.of(cfg.train.mixed_precision, request.hardware.device)
    machine = Machine(request.gpus, request.gpus_per_node, request.hardware)
    costs, batch, profiles = model_costs(cfg), cfg.train.global_batch_size, len(cfg.train.phema_stds)
    return (step_time(costs, plan.layout, machine, numerics, batch, profiles, objective),
            rank_memory(costs, plan.layout, batch, numerics, profiles, objective))


@pytest.mark.parametrize("objective,hardware,precision", [("transport", "cpu", "fp32"), ("diffusion", "h100", "bf16"),
                                                          ("transport", "h100", "bf16")])
def test_a_flow_or_diffusion_plan_is_priced_with_no_objective_calls(objective, hardware, precision):
    model = {**TINY_SIT, "name": "DiT-S/2"} if objective == "diffusion" else TINY_SIT
    cfg = _cfg(model, objective=objective, batch=16, mixed_precision=precision)
    assert step_calls(cfg) is NO_EXTRA
    request = make_request(cfg, 4, 4, hardware, 80)
    plans = plan_layouts(request)
    assert any(p.layout.pp > 1 for p in plans) and any(p.layout.tp > 1 for p in plans)  # nothing filtered
    for plan in plans:
        time, memory = _unpriced(cfg, request, plan)
        assert plan.time == time and plan.memory == memory


def test_a_meanflow_steps_compute_is_the_flow_steps_times_its_forwards():
    cfg = _cfg(meanflow=DEMO, mixed_precision="fp32")
    request = make_request(cfg, 1, 1, "cpu")
    m, dropout = cfg.meanflow, cfg.model.class_dropout_prob
    # The loss's forward and backward (3 forwards); the unconditional velocity on the kept labels (guidance over
    # all of t); on the rows with r != t the predicted tangent and the central difference's two forwards.
    forwards = 3 + (1 - dropout) * 1 + m.ratio * (1 + 2)
    plans = plan_layouts(request)
    assert plans
    for plan in plans:
        flow, _ = _unpriced(cfg, request, plan)
        assert plan.time.compute == pytest.approx(flow.compute * forwards / 3, rel=1e-9)
        assert plan.time.recompute == flow.recompute  # the calls without gradient recompute nothing
        assert plan.time.total > flow.total


def test_float32_calls_run_at_half_the_bf16_matmul_rate():
    hw = replace(load_hardware("h100"), matmul_half_tokens=0.0,
                 elementwise_gelem_s={k: 1e15 for k in ("pointwise", "norm", "act", "softmax")})
    cfg = _cfg(meanflow=DEMO, batch=64, mixed_precision="bf16")
    costs, machine, numerics = model_costs(cfg), Machine(1, 1, hw), Numerics.of("bf16", "cuda")

    def extra(call):
        priced = step_time(costs, Layout(), machine, numerics, 64, objective=ObjectiveCost(extra=(call,)))
        return priced.compute - step_time(costs, Layout(), machine, numerics, 64).compute

    half = extra(Call(0.5))
    assert half > 0
    assert extra(Call(0.5, float32=True)) == pytest.approx(2 * half, rel=1e-6)
    assert extra(Call(0.5, forwards=2, calls=2, float32=True)) == pytest.approx(4 * half, rel=1e-6)


def test_under_fsdp_with_bf16_a_meanflow_run_gathers_float32_weights_and_counts_autocasts_copies():
    hw = replace(load_hardware("h100"), overlap=False)  # every collective shows in the step's comm
    cfg = _cfg(model={"name": "SiT-B/2"}, meanflow=DEMO, batch=64, mixed_precision="bf16")
    objective = step_calls(cfg)
    assert objective.float32_gathers
    costs, machine, numerics, layout = model_costs(cfg), Machine(8, 8, hw), Numerics.of("bf16", "cuda"), Layout(dp_shard=8)
    flow = step_time(costs, layout, machine, numerics, 64)
    mean = step_time(costs, layout, machine, numerics, 64, objective=objective)
    gathered = costs.depth * costs.block.trainable + costs.first.trainable + costs.last.trainable
    lat = hw.link_latency_us * 1e-6 * (costs.depth + 1)

    def gather(width):
        return _gather(width * gathered, 8, machine.link(8), lat)

    calls = sum(c.calls for c in objective.extra)
    assert calls == 4  # the unconditional velocity, the tangent, the difference's two forwards
    # Forward and backward gather, and one gather per call, each of 4-byte weights; the reduce-scatter is as before.
    assert mean.comm - flow.comm == pytest.approx((2 + calls) * gather(4) - 2 * gather(2), rel=1e-9)

    [flow_mem], [mean_mem] = rank_memory(costs, layout, 64, numerics), rank_memory(costs, layout, 64, numerics,
                                                                                   objective=objective)
    assert mean_mem.comm == pytest.approx(2 * flow_mem.comm)  # the root and two blocks gathered, at 4 bytes
    weights = costs.depth * costs.block.matmul + costs.first.matmul + costs.last.matmul
    assert flow_mem.casts == 0 and mean_mem.casts == pytest.approx(2 * weights)  # bf16 copies of float32-gathered weights
    assert mean_mem.activations > flow_mem.activations  # FSDP casts block inputs to float32, not bf16


def test_jvp_graph_is_priced_as_two_float32_forward_and_backwards_through_the_math_attention():
    batch = 64
    cfg = _cfg(meanflow={"jvp": "graph", "omega": 1.0, "kappa": 0.0, "tangent": "predicted"}, batch=batch,
               mixed_precision="fp32")
    objective = step_calls(cfg)
    assert objective.loss.forwards == 2 and objective.loss.float32 and objective.loss.jvp
    costs, machine = model_costs(cfg), Machine(1, 1, load_hardware("cpu"))
    fused, math = Numerics.of("fp32", "cpu"), Numerics(4, fused_attention=False)
    graph = step_time(costs, Layout(), machine, fused, batch, objective=objective)
    # The JVP's primal and tangent with their backward on every row, the predicted tangent one forward on every row.
    expected = (2 * step_time(costs, Layout(), machine, math, batch).compute
                + step_time(costs, Layout(), machine, fused, batch).compute / 3)
    assert graph.compute == pytest.approx(expected, rel=1e-9)

    # Memory: float32 activations of both passes kept for the backward; no autocast copies (the loss is float32).
    bf16 = Numerics.of("bf16", "cuda")
    [kept] = rank_memory(costs, Layout(), batch, bf16, objective=objective)
    [ref] = rank_memory(costs, Layout(), batch, math)
    tokens = batch * costs.tokens
    transient = tokens * (costs.transient.nbytes(4, 1, 4) + costs.scores.nbytes(4, 1))
    # Beside them the predicted tangent's call, a float32 forward over every row: one block's working set.
    beside = max(transient, calls_transient(costs, Layout(), bf16.with_objective(objective), tokens, objective.extra))
    assert beside > transient
    assert ref.grads == 0 and kept.grads == 0  # the peak with every activation, before the gradients
    assert kept.activations - beside == pytest.approx(2 * (ref.activations - transient))
    assert kept.casts == 0 < rank_memory(costs, Layout(), batch, bf16, objective=step_calls(_cfg(meanflow={})))[0].casts


def test_the_planner_offers_only_layouts_a_meanflow_step_runs():
    def layouts(jvp):
        cfg = _cfg(meanflow={"jvp": jvp}, batch=16)
        return [p.layout for p in plan_layouts(make_request(cfg, 4, 4, "h100", 80))]

    separate, graph, difference = layouts("separate"), layouts("graph"), layouts("difference")
    assert all(lay.pp == 1 for lay in separate + graph + difference)
    assert all(lay.tp == 1 for lay in separate + graph) and any(lay.tp > 1 for lay in difference)
    assert any(lay.ac != "none" for lay in separate) and all(lay.ac == "none" for lay in graph)
    ddp = [lay for lay in graph + separate if lay.dp_replicate > 1 and lay.dp_shard == 1]
    assert ddp and all(lay in separate for lay in ddp) and not any(lay in graph for lay in ddp)


@pytest.mark.parametrize("sampler,section", [
    ("v0", {}),
    ("v1", {"logit_mean": -0.6, "logit_std": 1.6, "r_logit_mean": -4.0, "r_logit_std": 1.6, "ratio": 0.75}),
    ("v0", {"r_logit_mean": 0.5, "ratio": 0.5}),
])
def test_the_shares_are_those_the_sampler_draws(sampler, section):
    m = _cfg(meanflow={"tr_sampler": sampler, **section}).meanflow
    t, r = sample_t_r(400_000, m, generator=torch.Generator().manual_seed(0))
    assert moving_share(m) == pytest.approx((r != t).float().mean().item(), abs=3e-3)
    for lo, hi in ((0.0, 1.0), (0.2, 0.8), (0.5, 1.0), (0.0, 0.1)):
        drawn = ((t >= lo) & (t <= hi)).float().mean().item()
        assert t_share(m, lo, hi) == pytest.approx(drawn, abs=3e-3)


def test_the_guided_calls_skip_the_dropped_captions_of_a_text_model():
    pixart = {"name": "PixArt-alpha-XL/2-256", "depth": 2, "hidden_size": 48, "num_heads": 4, "text_hidden_size": 16,
              "input_size": 8}
    cfg = build_config({"output_dir": "unused", "model": pixart, "objective": "meanflow",
                        "meanflow": {"omega": 1.5, "kappa": 0.25, "guidance_t_start": 0.3},
                        "data": {"caption_dropout_prob": 0.3}})
    [guided, *_] = step_calls(cfg).extra
    assert guided.calls == 2 and guided.forwards == 2  # the unconditional and the conditional velocity
    assert guided.share == pytest.approx((1 - 0.3) * t_share(cfg.meanflow, 0.3, 1.0))
    assert guided.share != pytest.approx((1 - cfg.model.class_dropout_prob) * t_share(cfg.meanflow, 0.3, 1.0))


def test_dit_plan_says_how_many_forwards_a_meanflow_step_runs():
    from dit_trainer.plan.report import header

    flow, mean = _cfg(), _cfg(meanflow=DEMO)
    request = make_request(mean, 1, 1, "cpu")
    expected = 3 + (1 - mean.model.class_dropout_prob) + mean.meanflow.ratio * 3
    assert f"objective meanflow: {expected:.3g} forwards a sample per step" in header(request, model_costs(mean), [])
    assert "forwards" not in header(make_request(flow, 1, 1, "cpu"), model_costs(flow), [])


def test_the_calls_without_gradient_add_their_largest_working_set_beside_the_losss_activations():
    """In a float32 run every call computes at one width: the largest share of rows (the unconditional
    velocity's) sets the working set, which outweighs the backward's transients; a JVP holds twice a forward's;
    flow matching adds nothing."""
    batch = 8
    cfg = _cfg(meanflow=DEMO, batch=batch, mixed_precision="fp32")
    costs, numerics, tokens = model_costs(cfg), Numerics.of("fp32", "cpu"), batch * model_costs(cfg).tokens
    objective = step_calls(cfg)
    kept = costs.saved["none"] + costs.fused_attention
    largest = max(c.share for c in objective.extra)
    assert largest == pytest.approx(1 - cfg.model.class_dropout_prob)  # guided over every t, labels kept
    assert calls_transient(costs, Layout(), numerics, tokens, objective.extra) == pytest.approx(
        largest * tokens * kept.nbytes(4, 1, 4))
    jvp = step_calls(_cfg(meanflow={**DEMO, "jvp": "separate"}, batch=batch, mixed_precision="fp32"))
    # The JVP: primal and tangent over the moving rows, attention through SDPA's math kernel (its scores).
    dual = 2 * cfg.meanflow.ratio * tokens * (costs.saved["none"].nbytes(4, 1, 4) + costs.scores.nbytes(4, 1))
    assert calls_transient(costs, Layout(), numerics, tokens, jvp.extra) == pytest.approx(dual)
    [flow] = rank_memory(costs, Layout(), batch, numerics)
    [mean] = rank_memory(costs, Layout(), batch, numerics, objective=objective)
    backward = tokens * costs.transient.nbytes(4, 1, 4)
    assert mean.activations - flow.activations == pytest.approx(
        calls_transient(costs, Layout(), numerics, tokens, objective.extra) - backward)
    assert calls_transient(costs, Layout(), numerics, tokens, NO_EXTRA.extra) == 0
