"""Training straight from an image folder: the frozen VAE encodes images as batches first need
them and a latent cache in `dit extract`'s shard format keeps what it encoded (see `encoder`)."""

import os
import sys

from dit_trainer.vae import DEFAULT_VAE
from dit_trainer.data.images import IMAGE_EXTENSIONS
from dit_trainer.errors import DataError

# How many class folders are looked into before deciding a folder holds no images.
_PROBE_FOLDERS = 8


def _has_images(folder: str) -> bool:
    try:
        return any(not e.name.startswith(".") and e.name.lower().endswith(IMAGE_EXTENSIONS) and e.is_file()
                   for e in os.scandir(folder))
    except OSError:
        return False


def looks_like_image_folder(path) -> bool:
    """Whether `path` is laid out as `dit extract` reads: images, or class folders holding images."""
    path = os.fspath(path)
    if not os.path.isdir(path) or os.path.isfile(os.path.join(path, "manifest.json")):
        return False
    if any(n.endswith(".npy") for n in os.listdir(path)):
        return False  # per-file latents (a preview image beside them does not make them images)
    if _has_images(path):
        return True
    folders = sorted(e.path for e in os.scandir(path) if e.is_dir() and not e.name.startswith("."))
    return any(_has_images(f) for f in folders[:_PROBE_FOLDERS])


def vae_dtype_for(vae_dtype: str, device_type: str) -> str:
    """data.vae_dtype made concrete: auto is bf16 on a GPU, fp32 elsewhere."""
    if vae_dtype != "auto":
        return vae_dtype
    return "bf16" if device_type == "cuda" else "fp32"


def _say(line: str) -> None:
    if os.environ.get("RANK", "0") == "0":
        print(line, file=sys.stderr)


def _others(folder: str) -> str:
    """The other caches of the same image folder name beside `folder`, for the log line of a new one."""
    root, name = os.path.split(folder)
    stem = name.rsplit("-", 2)[0] + "-"
    try:
        others = sorted(n for n in os.listdir(root) if n.startswith(stem) and n != name)
    except OSError:
        return ""
    return f" (the folder, image size or VAE differ from those of {', '.join(others)})" if others else ""


def open_image_folder(path, vae=None, image_size: int = 256, vae_dtype: str = "auto", device: str = "auto",
                      cache_dir=None, random_flip: bool = True, seed: int = 0, text=None):
    """The dataset of image folder `path`: its complete latent cache as `LatentShards`, else an
    `ImageFolderLatents` holding the VAE that will encode the rest; one log line names the cache.
    `text` ({"encoder", "max_length", "dtype", "empty"}): `path` holds captioned images in any layout of
    `data.captions`, and the cache keeps the text encoder's outputs beside the latents (`TextShards`)."""
    from dit_trainer.data.fingerprint import fingerprint
    from dit_trainer.data.images import list_image_folder
    from dit_trainer.data.online import cache as lc
    from dit_trainer.devices import resolve_device

    path = os.fspath(path)
    kind = resolve_device(device).type
    if text is None:
        paths, labels, class_names = list_image_folder(path)
        listed = {}
    else:
        from dit_trainer.data.online import captions

        listing, listed = captions.open_listing(path, text, kind)
        paths, labels, class_names = listing.images, captions.labels_of(listing), None
    name = os.fspath(vae or DEFAULT_VAE)
    if os.path.isdir(os.path.expanduser(name)):
        name = os.path.abspath(os.path.expanduser(name))  # the run's config.yaml is read from anywhere
    dtype = vae_dtype_for(vae_dtype, kind)
    plan = lc.cache_plan(path, paths, labels, name, dtype, image_size, **listed)
    folder = lc.cache_folder(cache_dir or lc.default_root(), plan)
    if lc.read_manifest_or_none(folder) is not None:
        from dit_trainer.data.text_shards import open_shards

        _say(f"latent cache {folder}: complete, read as shards (the VAE is not loaded)")
        lc.remove_pieces(folder)  # left by a run killed between the manifest and the clean-up
        dataset = open_shards(folder, random_flip=random_flip, seed=seed, remedy=lc.remedy(folder))
        dataset.source = f"the image folder {path}"
        dataset.read_images_from(paths)  # REPA reads the images from the folder
        dataset.fingerprint = fingerprint(plan["data_path"], len(paths), plan["files_sha256"])
        return dataset
    from dit_trainer.data.online.dataset import ImageFolderLatents
    from dit_trainer.vae.autoencoder import latent_shape, load_vae, scaling

    known = lc.read_plan(folder)
    if known is not None and known.get("key") != plan["key"]:
        raise DataError(f"{folder} holds the latent cache of other images or another VAE (its {lc.PLAN} says so); "
                        "delete that folder")
    # Loaded in its compute dtype (a later cast warns and may skip modules kept in fp32), on the CPU
    # until the trainer's encoder moves it beside the model.
    model = load_vae(name, dtype, "cpu")
    sf, shift = scaling(model)
    plan = {**plan, "latent_shape": list(latent_shape(model, int(image_size))), "scaling_factor": sf,
            "shift_factor": shift}
    if known is None:
        lc.write_plan(folder, plan)  # a failed write is one line naming the cache
    dataset = ImageFolderLatents(path, folder, plan, paths, labels, class_names, random_flip, seed, vae=model)
    if text is not None:
        captions.attach(dataset, listing, plan["text"])
    dataset.fingerprint = fingerprint(plan["data_path"], len(paths), plan["files_sha256"])
    have = dataset.where.covered
    if known is None:
        _say(f"latent cache {folder}: new, for {path} at {image_size} px with VAE {name} ({dtype}){_others(folder)}; "
             f"the first epoch encodes the {len(paths)} images as batches need them"
             f"{' (slow on a CPU)' if kind == 'cpu' else ''}")
    else:
        _say(f"latent cache {folder}: {have} of {len(paths)} images encoded; the rest are encoded as batches need them")
    return dataset
