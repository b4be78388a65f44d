"""What the parity scripts share: the relative difference, the pass/fail table, importing a release's
code from a local checkout, a stand-in for the three timm classes the releases import, and weights
shared between our model and the release's.

Each script (dit.py, sit.py, large_dit.py) compares our code with one release's, imported at run
time from a checkout given with --reference; no release code lives in this repository.
"""

import argparse
import importlib
import math
import os
import sys
import types

import torch
import torch.nn as nn

# This checkout's code is the one compared, whatever version of the package is installed.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src"))


def parse_args(doc: str, reference_help: str, timm_shim: bool = True, argv=None) -> argparse.Namespace:
    """--reference DIR (required) and, for releases that import timm, --timm-shim DIR."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--reference", required=True, metavar="DIR", help=reference_help)
    if timm_shim:
        parser.add_argument("--timm-shim", metavar="DIR", default=None,
                            help="folder with a stand-in `timm` package, put first on sys.path")
    return parser.parse_args(argv)


def load_or_report(load, reference):
    """`load()`'s result, or None after one line on stderr when the release cannot be imported."""
    try:
        return load()
    except Exception as exc:  # noqa: BLE001 - any import failure means there is nothing to compare with
        print(f"{os.path.basename(sys.argv[0])}: error: cannot import the reference from {reference}: "
              f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return None


def rel_diff(ours, ref) -> float:
    """max|ours - ref| / max|ref|."""
    ours, ref = torch.as_tensor(ours).double(), torch.as_tensor(ref).double()
    if ours.shape != ref.shape:
        raise ValueError(f"shape {tuple(ours.shape)} vs reference {tuple(ref.shape)}")
    diff = (ours - ref).abs().max().item()
    scale = ref.abs().max().item()
    # An all-zero reference would make the comparison vacuous (adaLN-Zero's init does exactly
    # that), so it reads as NaN, which fails.
    return diff / scale if scale > 0 else float("nan")


class Table:
    """Collects (group, name, relative difference) rows against per-group bounds and prints them with pass/fail."""

    def __init__(self, bounds: dict):
        self.bounds = bounds
        self.rows = []

    def add(self, group, name, value, note=""):
        """One row; returns whether it passes."""
        bound = self.bounds[group]
        ok = value is not None and math.isfinite(value) and value < bound
        self.rows.append((group, name, value, bound, ok, note))
        return ok

    def fail(self, group, name, note):
        """A row for a check that could not be computed."""
        self.rows.append((group, name, None, self.bounds[group], False, note))

    @property
    def failed(self):
        """The rows that do not pass."""
        return [r for r in self.rows if not r[4]]

    def report(self, seconds: float) -> int:
        """Print the table and how many rows pass in `seconds`; returns the exit status (1 when any fails)."""
        print(self.render())
        print(f"{len(self.rows) - len(self.failed)}/{len(self.rows)} rows pass in {seconds:.1f} s")
        return 1 if self.failed else 0

    def render(self) -> str:
        """The rows as a markdown table."""
        gw = max(5, *(len(g) for g in self.bounds))
        width = max(len(r[1]) for r in self.rows)
        lines = [f"| {'group':<{gw}} | {'check':<{width}} | {'rel max diff':>12} | {'bound':>6} | result |",
                 f"|{'-' * (gw + 2)}|{'-' * (width + 2)}|{'-' * 14}|{'-' * 8}|--------|"]
        for group, name, value, bound, ok, note in self.rows:
            shown = "n/a" if value is None else f"{value:.2e}"
            lines.append(f"| {group:<{gw}} | {name:<{width}} | {shown:>12} | {bound:>6.0e} | "
                         f"{'pass' if ok else 'FAIL':<6} |" + (f" {note}" if note else ""))
        return "\n".join(lines)


def install_timm_stand_in():
    """A minimal `timm.models.vision_transformer` with timm's names and explicit-softmax attention.

    The attention is written out as softmax(q·kᵀ/√d)·v, so that our layers (which call
    scaled_dot_product_attention) are not compared with themselves.
    """

    class PatchEmbed(nn.Module):
        def __init__(self, img_size=224, patch_size=16, in_chans=3, embed_dim=768, bias=True):
            super().__init__()
            self.img_size, self.patch_size = (img_size, img_size), (patch_size, patch_size)
            self.num_patches = (img_size // patch_size) ** 2
            self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size, bias=bias)

        def forward(self, x):
            return self.proj(x).flatten(2).transpose(1, 2)

    class Attention(nn.Module):
        def __init__(self, dim, num_heads=8, qkv_bias=False, **_):
            super().__init__()
            self.num_heads, self.head_dim = num_heads, dim // num_heads
            self.scale = self.head_dim**-0.5
            self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
            self.proj = nn.Linear(dim, dim)

        def forward(self, x):
            b, n, c = x.shape
            q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
            attn = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
            return self.proj((attn @ v).transpose(1, 2).reshape(b, n, c))

    class Mlp(nn.Module):
        def __init__(self, in_features, hidden_features=None, act_layer=nn.GELU, drop=0.0, **_):
            super().__init__()
            self.fc1 = nn.Linear(in_features, hidden_features)
            self.act = act_layer()
            self.fc2 = nn.Linear(hidden_features, in_features)

        def forward(self, x):
            return self.fc2(self.act(self.fc1(x)))

    vit = types.ModuleType("timm.models.vision_transformer")
    vit.PatchEmbed, vit.Attention, vit.Mlp = PatchEmbed, Attention, Mlp
    timm, timm_models = types.ModuleType("timm"), types.ModuleType("timm.models")
    timm.models, timm_models.vision_transformer = timm_models, vit
    sys.modules.update({"timm": timm, "timm.models": timm_models, "timm.models.vision_transformer": vit})


def import_reference(reference, package: str, timm_shim=None, stand_in: bool = False):
    """Import the release's `models` and `package` modules from the checkout, never from elsewhere.

    `timm_shim` is put first on sys.path; without it, `stand_in` registers install_timm_stand_in's.
    """
    for path in ("models.py", os.path.join(package, "__init__.py")):
        if not os.path.isfile(os.path.join(reference, path)):
            raise FileNotFoundError(f"{os.path.join(reference, path)} does not exist")
    for name in ("models", package):
        if name in sys.modules:
            raise RuntimeError(f"a module named {name!r} is already imported; cannot import the reference's")
    if timm_shim:
        sys.path.insert(0, os.path.abspath(timm_shim))
    elif stand_in:
        install_timm_stand_in()
    sys.path.insert(0, os.path.abspath(reference))
    modules = importlib.import_module("models"), importlib.import_module(package)
    for mod in modules:
        where = os.path.abspath(mod.__file__)
        if not where.startswith(os.path.abspath(reference) + os.sep):
            raise RuntimeError(f"{mod.__name__} was imported from {where}, not from {reference}")
    return modules


@torch.no_grad()
def randomise_(model, seed, scale=1.0):
    """Give every parameter but the fixed sin-cos pos_embed O(1)-output random values.

    adaLN-Zero zeroes the modulation and output layers at init, which would make every output 0
    and the comparison vacuous.
    """
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if name == "pos_embed":
            continue
        if p.dim() >= 2:
            p.copy_(scale * torch.randn(p.shape, generator=g) / math.sqrt(p[0].numel()))
        else:
            p.copy_(0.1 * scale * torch.randn(p.shape, generator=g))


def share_weights(ours, theirs):
    """Copy ours -> theirs and back with strict loading, which also checks every name and shape."""
    ours_sd, theirs_sd = ours.state_dict(), theirs.state_dict()
    only_ours = sorted(set(ours_sd) - set(theirs_sd))
    only_theirs = sorted(set(theirs_sd) - set(ours_sd))
    shapes = [k for k in set(ours_sd) & set(theirs_sd) if ours_sd[k].shape != theirs_sd[k].shape]
    if only_ours or only_theirs or shapes:
        raise RuntimeError(f"state_dict mismatch: only ours {only_ours[:5]}, only reference "
                           f"{only_theirs[:5]}, shapes differ {shapes[:5]}")
    theirs.load_state_dict(ours.state_dict(), strict=True)
    ours.load_state_dict(theirs.state_dict(), strict=True)
