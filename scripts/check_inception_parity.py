"""Check dit_trainer's FID Inception against torch-fidelity's, layer for layer, with shared random weights.

    pip install --no-deps --target /tmp/tf torch-fidelity
    python scripts/check_inception_parity.py --reference /tmp/tf [--weights weights-inception-2015-12-05-6726825d.pth]

torch-fidelity's package __init__ imports torchvision, its Inception modules do not: the package is
registered without running __init__, so no torchvision is needed. Without --weights both networks get the same
random weights (written to a temporary .pth in torch-fidelity's format). Compares the pool
features, the unbiased logits, the spatial features (a hook on Mixed_6d.branch1x1, ADM's
mixed_6/conv) and the TF1 resize. Prints the largest relative differences; exits 1 past 1e-4.
"""

import argparse
import pathlib
import sys
import tempfile
import types

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from dit_trainer.evaluate.inception import FIDInceptionV3, load_inception  # noqa: E402
from dit_trainer.evaluate.resize import resize_bilinear_tf1  # noqa: E402


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reference", required=True, help="folder holding the torch_fidelity package")
    p.add_argument("--weights", help="the real weight file (default: shared random weights)")
    p.add_argument("--size", type=int, default=64, help="input image size (default 64)")
    args = p.parse_args()
    package = types.ModuleType("torch_fidelity")
    package.__path__ = [str(pathlib.Path(args.reference) / "torch_fidelity")]
    sys.modules["torch_fidelity"] = package
    from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3
    from torch_fidelity.interpolate_compat_tensorflow import interpolate_bilinear_2d_like_tensorflow1x

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        weights = args.weights
        if weights is None:
            ours = FIDInceptionV3()
            for m in ours.modules():  # non-trivial batch-norm statistics, so a misplaced bn shows
                if isinstance(m, torch.nn.BatchNorm2d):
                    m.running_mean.uniform_(-0.1, 0.1)
                    m.running_var.uniform_(0.5, 1.5)
                    m.bias.data.uniform_(-0.1, 0.1)
            weights = f"{tmp}/w.pth"
            torch.save({k: v for k, v in ours.state_dict().items() if "num_batches" not in k}, weights)
        ours = load_inception(weights)
        theirs = FeatureExtractorInceptionV3("inception-v3-compat", ["2048", "logits_unbiased"],
                                             feature_extractor_weights_path=weights).eval()
    spatial = []
    theirs.Mixed_6d.branch1x1.register_forward_hook(lambda m, i, o: spatial.append(o))
    images = torch.randint(0, 256, (4, 3, args.size, args.size), dtype=torch.uint8)
    with torch.no_grad():
        mine = ours(images.float())
        pool, logits = theirs(images)
    ref_spatial = spatial[0][:, :7].permute(0, 2, 3, 1).flatten(1)
    resize_ours = resize_bilinear_tf1(images.float(), 299)
    resize_theirs = interpolate_bilinear_2d_like_tensorflow1x(images.float(), size=(299, 299), align_corners=False)
    diffs = {"resize": rel(resize_ours, resize_theirs), "pool": rel(mine["pool"], pool),
             "logits": rel(mine["logits"], logits), "spatial": rel(mine["spatial"], ref_spatial)}
    for k, v in diffs.items():
        print(f"{k:8s} max relative difference {v:.2e}")
    print("magnitudes (max |x|):", {k: round(float(v.abs().max()), 4) for k, v in mine.items()})
    return 0 if max(diffs.values()) < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
