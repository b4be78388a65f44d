"""In-process checks of the parallel building blocks (no process group needed)."""

import shutil

import pytest
import torch

from dit_trainer.errors import ConfigError
from dit_trainer.models import DiT
from dit_trainer.parallel import ParallelDims, apply_ac, fused_rows_to_full_layout, fused_rows_to_tp_layout
from dit_trainer.parallel.pipeline_parallel import TargetPacking, stage_ranges


def test_free_degree_takes_the_rest():
    dims = ParallelDims(dp_replicate=1, dp_shard=-1, tp=2, pp=2, world_size=8)
    assert (dims.dp_shard, dims.dp_size, dims.fsdp_enabled, dims.tp_enabled, dims.pp_enabled) == (2, 2, True, True, True)
    assert ParallelDims(world_size=1).dp_shard == 1


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(dp_shard=1, tp=4, world_size=2), "do not multiply to the world size 2"),
        # dp_shard is already -1: what conflicts is tp and the world size.
        (dict(dp_shard=-1, tp=3, world_size=4), "parallel.tp=3 needs a multiple of 3 processes, but the world size is 4"),
        (dict(dp_shard=-1, tp=2, world_size=1), "parallel.dp_shard=-1 gets no whole share"),
        (dict(dp_shard=-1, tp=-1, world_size=4), "only one parallel degree may be -1"),
        (dict(dp_shard=0, world_size=1), "must be positive or -1"),
    ],
)
def test_bad_degrees_are_one_line_errors(kwargs, needle):
    with pytest.raises(ConfigError) as info:
        ParallelDims(**kwargs)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_fused_row_regrouping_gives_each_rank_whole_heads():
    heads, head_dim, tp = 4, 2, 2
    dim = heads * head_dim
    # Row r of the released qkv: (which of q/k/v, head, channel) encoded as a number.
    rows = torch.tensor([s * 100 + h * 10 + c for s in range(3) for h in range(heads) for c in range(head_dim)])
    w = rows[:, None].float().expand(3 * dim, 5).contiguous()
    grouped = fused_rows_to_tp_layout(w, 3, tp)
    for r, shard in enumerate(grouped.chunk(tp)):
        codes = shard[:, 0].long().view(3, -1)  # what Attention.forward reshapes into (3, heads/tp, head_dim)
        assert codes.div(100, rounding_mode="floor").unique(dim=1).flatten().tolist() == [0, 1, 2]
        own = {int(v) // 10 % 10 for v in codes.flatten()}
        assert own == set(range(r * heads // tp, (r + 1) * heads // tp))
    assert torch.equal(fused_rows_to_full_layout(grouped, 3, tp), w)
    bias = rows.float()
    assert torch.equal(fused_rows_to_full_layout(fused_rows_to_tp_layout(bias, 3, tp), 3, tp), bias)


def test_target_round_trip():
    carried = {"x": torch.randn(3, 4, 2, 2), "noise": torch.randn(3, 4, 2, 2),
               "t": torch.tensor([0, 517, 999]), "weight": torch.tensor([1.0, 0.5, 2.0])}
    packing = TargetPacking(carried)
    packed = packing.pack(carried)
    assert packed.is_contiguous() and packed.shape == (3, 2 * 16 + 2)
    back = packing.unpack(packed)
    assert list(back) == list(carried)
    for name, value in carried.items():
        assert back[name].dtype == value.dtype and torch.equal(back[name], value), name
    # A microbatch (what the schedule hands the last stage) unpacks the same way.
    half = packing.unpack(packed[1:])
    assert torch.equal(half["t"], carried["t"][1:])


def test_stage_ranges():
    assert stage_ranges(28, 4) == [(0, 7), (7, 14), (14, 21), (21, 28)]
    assert stage_ranges(5, 2) == [(0, 3), (3, 5)]
    with pytest.raises(ConfigError, match="at most 2"):
        stage_ranges(2, 4)
    # interleaved1f1b at parallel.pp 2 on 3 blocks: the 4 comes from the schedule's 2 stages per rank.
    with pytest.raises(ConfigError, match=r"parallel.pp 2 x 2 stages per rank of the interleaved1f1b schedule asks for 4"):
        stage_ranges(3, 4, per_rank=2)


def _tiny(**kw):
    torch.manual_seed(0)
    # Blocks of tests/models/test_routing.py's width and heads: inductor's cache serves their compiled graph again.
    model = DiT(input_size=8, patch_size=2, in_channels=4, hidden_size=32, depth=3, num_heads=2, num_classes=10, **kw)
    for p in model.parameters():  # leave adaLN-Zero's identity start so that gradients are non-trivial
        torch.nn.init.normal_(p, std=0.05)
    return model


def _loss_and_grads(model):
    g = torch.Generator().manual_seed(1)
    x, t, y = torch.randn(2, 4, 8, 8, generator=g), torch.tensor([3, 700]), torch.tensor([1, 2])
    model.zero_grad()
    loss = model(x, t, y, force_drop_ids=torch.zeros(2, dtype=torch.long)).square().mean()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_activation_checkpointing_keeps_names_and_gradients(mode):
    ref_loss, ref_grads = _loss_and_grads(_tiny())
    model = _tiny()
    names = [n for n, _ in model.named_parameters()]
    apply_ac(list(model.blocks), mode)
    assert [n for n, _ in model.named_parameters()] == names
    loss, grads = _loss_and_grads(model)
    assert torch.equal(loss, ref_loss)
    for n in ref_grads:
        torch.testing.assert_close(grads[n], ref_grads[n], rtol=0, atol=0)


def test_selective_policy_saves_linear_outputs_and_recomputes_attention_matmuls():
    from torch.utils.checkpoint import CheckpointPolicy

    from dit_trainer.parallel.parallelize import _selective_policy

    policy, aten = _selective_policy(), torch.ops.aten
    for op in (aten.mm.default, aten.addmm.default, aten._scaled_dot_product_flash_attention_for_cpu.default):
        assert policy(None, op) == CheckpointPolicy.MUST_SAVE, op
    # The CPU attention kernel's scores (heads x tokens^2) are among the largest tensors of a block.
    for op in (aten.bmm.default, aten.gelu.default, aten.native_layer_norm.default):
        assert policy(None, op) == CheckpointPolicy.PREFER_RECOMPUTE, op


@pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="inductor needs a C compiler on CPU")
@pytest.mark.usefixtures("scalar_kernels")
def test_compile_composes_with_activation_checkpointing():
    from torch._dynamo.utils import counters

    from dit_trainer.parallel import apply_compile

    ref_loss, ref_grads = _loss_and_grads(_tiny())
    model = _tiny()
    apply_ac(list(model.blocks), "selective")
    apply_compile(list(model.blocks))  # torchtitan's order: AC inside, compile around it
    counters.clear()
    loss, grads = _loss_and_grads(model)
    assert counters["stats"]["unique_graphs"] >= 1  # the blocks were compiled, not skipped
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    assert set(grads) == set(ref_grads)
    for n in ref_grads:
        # Inductor's attention backward reorders sums; the near-uniform attention of this tiny
        # model makes the small qkv gradients cancel, so compare per-tensor norms of the error.
        assert (grads[n] - ref_grads[n]).norm() <= 0.05 * ref_grads[n].norm() + 1e-7, n


@pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="inductor needs a C compiler on CPU")
@pytest.mark.usefixtures("scalar_kernels")
def test_compiled_blocks_share_one_graph_and_never_recompile_for_a_new_batch():
    """A last partial batch or a doubled CFG batch must neither recompile nor fall back to eager."""
    from torch._dynamo.utils import counters

    from dit_trainer.parallel import apply_compile

    model = _tiny()
    apply_compile(list(model.blocks))
    counters.clear()

    def step(batch):
        g = torch.Generator().manual_seed(batch)
        x = torch.randn(batch, 4, 8, 8, generator=g)
        t, y = torch.randint(0, 1000, (batch,), generator=g), torch.randint(0, 10, (batch,), generator=g)
        model(x, t, y).square().mean().backward()

    step(4)
    assert counters["stats"]["unique_graphs"] == 1  # every block runs the one graph
    with torch._dynamo.config.patch(error_on_recompile=True):
        for batch in (3, 8, 5):
            step(batch)
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="inductor needs a C compiler on CPU")
@pytest.mark.usefixtures("scalar_kernels")
def test_activation_memory_budget_recomputes_instead_of_saving():
    """The budget is read while a block's graph compiles: under a lower one the compiled blocks save
    fewer bytes for the backward, and the gradients stay what they were."""
    from torch._functorch import config as functorch_config

    from dit_trainer.parallel import apply_compile

    def run(budget):
        torch._dynamo.reset()  # graphs keep the partition of their first compile
        model = _tiny()
        apply_compile(list(model.blocks))
        saved = []

        def pack(t):
            saved.append(t.numel() * t.element_size())
            return t

        hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        with functorch_config.patch(activation_memory_budget=budget), hooks:
            loss, grads = _loss_and_grads(model)
        return sum(saved), loss, grads

    full_bytes, ref_loss, ref_grads = run(1.0)
    budget_bytes, loss, grads = run(0.5)
    assert budget_bytes < 0.8 * full_bytes, (budget_bytes, full_bytes)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-7)
    for n in ref_grads:
        torch.testing.assert_close(grads[n], ref_grads[n], rtol=1e-4, atol=1e-6, msg=n)
