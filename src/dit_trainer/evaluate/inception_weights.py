"""The FID Inception's weight file: one the user names, or torch-fidelity's release fetched once into torch's hub cache.

The file is torch-fidelity's `weights-inception-2015-12-05-6726825d.pth` (its release v0.2.0
re-uploads pytorch-fid's converted weights). It is downloaded on first use to
`torch.hub.get_dir()/checkpoints/`, where torch-fidelity and torchmetrics keep the same file,
and its sha256 is checked before it is kept: a wrong or truncated download never reaches the
cache. Offline, the first use is a one-line error saying where to put the file or to pass
`--weights FILE`.
"""

import hashlib
import os
import sys
from pathlib import Path
from urllib.parse import urlparse

from dit_trainer.errors import CheckpointError, DitError

INCEPTION_WEIGHTS_FILE = "weights-inception-2015-12-05-6726825d.pth"
INCEPTION_WEIGHTS_URL = "https://github.com/toshas/torch-fidelity/releases/download/v0.2.0/" + INCEPTION_WEIGHTS_FILE
# The file's sha256 (the release names the file with its first 8 hex digits, torch.hub's rule); the
# download is checked over all 64 digits.
INCEPTION_WEIGHTS_SHA256 = "6726825d0af5f729cebd5821db510b11b1cfad8faad88a03f1befd49fb9129b2"


def hub_checkpoint_path(file_name: str = INCEPTION_WEIGHTS_FILE) -> Path:
    """Where torch's hub cache keeps `file_name` (honours TORCH_HOME, as torch.hub does)."""
    import torch

    return Path(torch.hub.get_dir()) / "checkpoints" / file_name


def fetch_inception_weights(url=None, sha256=None, progress: bool = True) -> Path:
    """The Inception weight file in torch's hub cache, downloaded from `url` and sha256-checked on first use."""
    import torch

    # Read here, not as defaults: tests point them at a local file.
    url = url or INCEPTION_WEIGHTS_URL
    sha256 = (sha256 or INCEPTION_WEIGHTS_SHA256).lower()
    name = os.path.basename(urlparse(url).path) or INCEPTION_WEIGHTS_FILE
    dst = hub_checkpoint_path(name)
    if dst.is_file():
        return dst
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        # Writes a temporary file beside dst, checks its sha256 against the prefix, then renames it:
        # an interrupted or wrong download leaves nothing under dst's name.
        torch.hub.download_url_to_file(url, str(dst), hash_prefix=sha256, progress=progress)
    except RuntimeError as err:
        if "invalid hash value" not in str(err):
            raise
        got = str(err).rsplit('"', 2)[-2] if str(err).count('"') >= 4 else "another digest"
        raise CheckpointError(f"the Inception weights downloaded from {url} have sha256 {got}, not {sha256}...; "
                              f"nothing was kept: retry, or download {name} yourself and pass --weights FILE") from None
    except OSError as err:  # URLError, HTTPError, timeouts, a read-only cache
        reason = str(getattr(err, "reason", None) or err).replace("\n", " ")
        raise DitError(f"the Inception network needs its weights and cannot download them ({reason}): download "
                       f"{name} from {url} into {dst.parent}, or pass --weights FILE") from None
    return dst


def note_other_weights(path) -> bool:
    """One warning line when the --weights file is not the published one (its sha256 does not begin with
    the 8 hex digits the release's name carries): the keys may match while the numbers are another
    network's. True when it warned."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    got, want = digest.hexdigest(), INCEPTION_WEIGHTS_SHA256[:8]
    if got.startswith(want):
        return False
    print(f"warning: --weights {path} has sha256 {got[:16]}..., not the {want}... of {INCEPTION_WEIGHTS_FILE}: "
          "its FID and IS compare with published numbers only if it holds the same network; pass that file "
          "or leave out --weights", file=sys.stderr, flush=True)
    return True
