#!/usr/bin/env python
"""Numerical parity of dit_trainer's Large-DiT (`DiT_Llama`) with Alpha-VLLM's release.

Usage: python scripts/parity/large_dit.py --reference DIR

DIR is a checkout of Alpha-VLLM/LLaMA2-Accessory (or its `Large-DiT-ImageNet` folder); the
release's `models.py` is imported from there, never copied. It imports apex (FusedRMSNorm),
fairscale (model-parallel linears and embedding) and flash-attn; this script puts small
stand-ins for them into `sys.modules` first so the release runs on CPU at model-parallel size 1
(its float32 attention path is SDPA with explicitly repeated kv heads, so flash-attn is never
called). The stand-in RMSNorm is written out in float32 math rather than torch.nn.RMSNorm, so it
does not share code with ours.

For each case the release model is built, every parameter is randomised (adaLN-Zero would
otherwise make every output zero), its state dict is loaded into ours with `strict=True` (every
name and shape must match), and both run the same inputs in float32:

  forward            eval mode, conditional labels
  forward(null)      labels forced to the null class (force_drop_ids on ours, label 1000 on theirs)
  forward_with_cfg   the release's guidance (ours with cfg_channels=3, the release's choice)

Each row is max|ours - ref| / max|ref|, and must be < 1e-5. The three released sizes are then
built on the `meta` device by both and their parameter counts (the release's own
`parameter_count()`) must be equal. Last, the initial
parameter statistics of the two (same shapes, independent seeds) are compared: a tensor whose
mean or std differs by more than a loose bound is listed, which would mean our `init_weights`
drifted from the release's.

Exit status: 0 when every row passes, 1 when any fails, 2 when the reference cannot be imported.
"""

import importlib.util
import os
import sys
import time
import types

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")  # the release @torch.compile's its SwiGLU gate

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from common import load_or_report, parse_args, rel_diff  # noqa: E402

BOUND = 1e-5


def install_stubs():
    """Stand-ins for apex, fairscale's model-parallel layers and flash-attn, at world size 1."""

    class ColumnParallelLinear(nn.Linear):
        def __init__(self, in_features, out_features, bias=True, gather_output=True, init_method=None, **_):
            super().__init__(in_features, out_features, bias=bias)
            if init_method is not None:
                init_method(self.weight)
            if bias:
                nn.init.zeros_(self.bias)  # fairscale zeroes the bias of its parallel linears

    class RowParallelLinear(ColumnParallelLinear):
        def __init__(self, in_features, out_features, bias=True, input_is_parallel=False, init_method=None, **_):
            super().__init__(in_features, out_features, bias=bias, init_method=init_method)

    class ParallelEmbedding(nn.Embedding):
        def __init__(self, num_embeddings, embedding_dim, init_method=None, **_):
            super().__init__(num_embeddings, embedding_dim)
            if init_method is not None:
                init_method(self.weight)

    class FusedRMSNorm(nn.Module):
        def __init__(self, normalized_shape, eps=1e-5, **_):
            super().__init__()
            self.eps = eps
            self.weight = nn.Parameter(torch.ones(normalized_shape))

        def forward(self, x):
            xf = x.float()
            y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
            return (y * self.weight.float()).type_as(x)

    def flash_attn_func(*args, **kwargs):
        raise RuntimeError("flash-attn stand-in called: the parity check runs float32 only")

    def module(name, **attrs):
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        sys.modules[name] = mod
        return mod

    module("apex")
    module("apex.normalization", FusedRMSNorm=FusedRMSNorm)
    module("fairscale")
    module("fairscale.nn")
    module("fairscale.nn.model_parallel")
    module(
        "fairscale.nn.model_parallel.initialize",
        get_model_parallel_world_size=lambda: 1,
        get_model_parallel_rank=lambda: 0,
        get_model_parallel_src_rank=lambda: 0,
        get_model_parallel_group=lambda: None,
    )
    module(
        "fairscale.nn.model_parallel.layers",
        ColumnParallelLinear=ColumnParallelLinear,
        RowParallelLinear=RowParallelLinear,
        ParallelEmbedding=ParallelEmbedding,
    )
    module("flash_attn", flash_attn_func=flash_attn_func)


def import_release(reference):
    """The release's models.py as module `large_dit_release`."""
    for path in (os.path.join(reference, "Large-DiT-ImageNet", "models.py"), os.path.join(reference, "models.py")):
        if os.path.isfile(path):
            spec = importlib.util.spec_from_file_location("large_dit_release", path)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            return mod, path
    raise FileNotFoundError(f"no Large-DiT-ImageNet/models.py under {reference}; pass the LLaMA2-Accessory checkout")


# (name, constructor arguments shared by both models); small widths so the check runs on CPU.
CASES = [
    ("MHA", dict(dim=256, n_layers=3, n_heads=8)),
    ("MHA + qk_norm", dict(dim=256, n_layers=3, n_heads=8, qk_norm=True)),
    ("GQA 8q/2kv", dict(dim=256, n_layers=3, n_heads=8, n_kv_heads=2)),
    ("GQA 8q/2kv + qk_norm", dict(dim=256, n_layers=3, n_heads=8, n_kv_heads=2, qk_norm=True)),
    ("ffn_dim_multiplier 1.3, multiple_of 64", dict(dim=192, n_layers=2, n_heads=6, multiple_of=64, ffn_dim_multiplier=1.3)),
    ("dim 1280 > 1024 (c capped), qk_norm", dict(dim=1280, n_layers=2, n_heads=10, n_kv_heads=5, qk_norm=True)),
]
COMMON = dict(input_size=16, patch_size=2, in_channels=4, num_classes=1000, learn_sigma=True, class_dropout_prob=0.1)


def randomize(model, generator):
    """Random weights everywhere (norm gains around 1), so no branch of either model is inert."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("_norm.weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=generator))
            else:
                p.copy_(torch.randn(p.shape, generator=generator) / max(1, p.shape[-1]) ** 0.5)


def run_case(release, name, kwargs, seed):
    """Rows of (case, check, relative difference) for one constructor configuration."""
    from dit_trainer.models.large_dit import DiT_Llama

    args = {**COMMON, **kwargs}
    g = torch.Generator().manual_seed(seed)
    ref = release.DiT_Llama(**args).eval()
    randomize(ref, g)
    ours = DiT_Llama(**args).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    back = release.DiT_Llama(**args)
    back.load_state_dict(ours.state_dict(), strict=True)  # and the other way round

    n = 4
    x = torch.randn(n, 4, 16, 16, generator=g)
    t = torch.randint(0, 1000, (n,), generator=g)
    y = torch.randint(0, 1000, (n,), generator=g)
    rows = []
    with torch.no_grad():
        rows.append((name, "forward", rel_diff(ours(x, t, y), ref(x, t, y))))
        null = torch.full_like(y, 1000)
        rows.append((name, "forward(null)", rel_diff(ours(x, t, y, force_drop_ids=torch.ones_like(y)), ref(x, t, null))))
        y_cfg = torch.cat([y[: n // 2], null[: n // 2]])
        rows.append((name, "forward_with_cfg", rel_diff(
            ours.forward_with_cfg(x, t, y_cfg, 4.0, cfg_channels=3), ref.forward_with_cfg(x, t, y_cfg, 4.0))))
    return rows


def init_notes(release):
    """Tensors whose initial mean/std differ between the release and ours (same shapes)."""
    from dit_trainer.models.large_dit import DiT_Llama

    args = {**COMMON, "dim": 256, "n_layers": 2, "n_heads": 8, "qk_norm": True}
    torch.manual_seed(0)
    ref = dict(release.DiT_Llama(**args).named_parameters())
    torch.manual_seed(1)
    ours = dict(DiT_Llama(**args).named_parameters())
    notes = []
    for key, p in ours.items():
        q = ref[key]
        ps, qs = p.float().std().item() if p.numel() > 1 else 0.0, q.float().std().item() if q.numel() > 1 else 0.0
        pm, qm = p.float().mean().item(), q.float().mean().item()
        if abs(ps - qs) > 0.1 * max(ps, qs) + 1e-6 or abs(pm - qm) > 0.1 * max(ps, qs) + 1e-6:
            notes.append(f"{key}: ours mean {pm:.4g} std {ps:.4g}, release mean {qm:.4g} std {qs:.4g}")
    return notes


def size_rows(release):
    """(name, release's parameter_count(), ours) for each released size, built on `meta`."""
    from dit_trainer.models.large_dit import DiT_Llama_models

    rows = []
    for size in ("600M", "3B", "7B"):
        for qk_norm in (False, True):
            with torch.device("meta"):
                ref = release.DiT_models[f"DiT_Llama_{size}_patch2"](input_size=32, qk_norm=qk_norm)
                ours = DiT_Llama_models[f"LargeDiT-{size}/2"](input_size=32, qk_norm=qk_norm)
            name = f"DiT_Llama_{size}_patch2" + (" qk_norm" if qk_norm else "")
            rows.append((name, ref.parameter_count(), sum(p.numel() for p in ours.parameters())))
    return rows


def main(argv=None):
    """Compare, print the rows and return the exit status."""
    args = parse_args(__doc__, "LLaMA2-Accessory checkout (or its Large-DiT-ImageNet folder)", timm_shim=False,
                      argv=argv)
    torch.set_num_threads(1)
    install_stubs()
    loaded = load_or_report(lambda: import_release(args.reference), args.reference)
    if loaded is None:
        return 2
    release, path = loaded

    start = time.time()
    rows = []
    for i, (name, kwargs) in enumerate(CASES):
        rows.extend(run_case(release, name, kwargs, seed=i))
    print(f"Large-DiT parity vs {path} (torch {torch.__version__}, float32, CPU)")
    print(f"{'case':42s} {'check':18s} {'rel. diff':>10s}  bound   ok")
    ok_all = True
    for case, check, value in rows:
        ok = value < BOUND
        ok_all &= ok
        print(f"{case:42s} {check:18s} {value:10.2e}  {BOUND:.0e}  {'PASS' if ok else 'FAIL'}")
    print(f"{'release size (256x256, 1000 classes)':42s} {'release count':>15s} {'ours':>15s}  ok")
    for name, theirs, mine in size_rows(release):
        ok_all &= theirs == mine
        print(f"{name:42s} {theirs:15,d} {mine:15,d}  {'PASS' if theirs == mine else 'FAIL'}")
    notes = init_notes(release)
    print("initialisation: " + ("every tensor's mean/std matches the release" if not notes else "differs:"))
    for note in notes:
        print("  " + note)
    print(f"{len(rows)} output rows and 6 size rows, {'all pass' if ok_all else 'FAILURES'}, {time.time() - start:.1f} s")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
