"""Where a text encoder's model and tokenizer are, and whether they are safe to read.

A name is a folder (transformers' save_pretrained: config.json, *.safetensors and the tokenizer's
files; or a diffusers pipeline folder with `text_encoder/` and `tokenizer/`, and `text_encoder_N/`
beside `tokenizer_N/`) or a Hugging Face id, read from the local cache (downloaded only when the Hub
answers at once). These files come from the internet: a folder that asks for code of its own
(`auto_map`, what `trust_remote_code` would run) or holds its weights only pickled (`.bin`, which
unpickling can turn into code) is refused in one line before transformers opens anything.
"""

import json
import os
from typing import Tuple

from dit_trainer.errors import DataError, one_line
from dit_trainer.vae.autoencoder import looks_like_path

# Files that make a folder a tokenizer's (fast tokenizers, sentencepiece, BPE vocabularies).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "spiece.model", "tokenizer.model", "vocab.json")
PICKLED = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
# What a text encoder needs of a Hub repo: config, safetensors weights, tokenizer files, at the top or
# in a pipeline's text_encoder/ and tokenizer/ (fnmatch's * crosses "/", so each pattern is anchored).
HUB_PATTERNS = ["config.json", "model*.safetensors*", "tokenizer*", "spiece.model", "special_tokens_map.json",
                "vocab.json", "merges.txt", "added_tokens.json", "text_encoder/config.json",
                "text_encoder/model*.safetensors*"]
HUB_PROBE_TIMEOUT_S = 5


def _download_hint(repo_id: str) -> str:
    return (f"on a connected machine run `hf download {repo_id} --local-dir DIR` and pass DIR (copied here), or set "
            "HF_HOME to a cache that holds it")


def _hub_folder(repo_id: str) -> str:
    """The local snapshot of Hub repo `repo_id`: the cache's, else downloaded if the Hub answers at once."""
    try:
        from huggingface_hub import HfApi, snapshot_download
        from huggingface_hub.constants import HF_HUB_CACHE
    except ImportError:
        raise DataError(f"text encoder {repo_id!r} is a Hugging Face id, which needs huggingface_hub "
                        f"(pip install huggingface_hub); or {_download_hint(repo_id)}") from None
    try:
        return snapshot_download(repo_id, local_files_only=True, allow_patterns=HUB_PATTERNS)
    except Exception:  # noqa: BLE001 - not cached (or an odd cache): try the Hub once
        pass
    try:  # one request without retries: offline, a download would retry for half a minute
        HfApi().model_info(repo_id, timeout=HUB_PROBE_TIMEOUT_S)
    except Exception as err:  # noqa: BLE001 - any failure means the download cannot work now
        raise DataError(f"text encoder {repo_id!r} is not in the Hugging Face cache ({HF_HUB_CACHE}) and cannot be "
                        f"downloaded ({one_line(err)}); {_download_hint(repo_id)}") from None
    try:
        return snapshot_download(repo_id, allow_patterns=HUB_PATTERNS)
    except Exception as err:  # noqa: BLE001
        raise DataError(f"cannot download text encoder {repo_id!r} ({one_line(err)}); {_download_hint(repo_id)}") from None


def _has_tokenizer(folder: str) -> bool:
    return any(os.path.isfile(os.path.join(folder, f)) for f in TOKENIZER_FILES)


def _layout(base: str) -> Tuple[str, str]:
    """(model folder, tokenizer folder) of a save_pretrained folder or a diffusers pipeline folder."""
    if os.path.isfile(os.path.join(base, "config.json")):
        model = base
    elif os.path.isfile(os.path.join(base, "text_encoder", "config.json")):
        model = os.path.join(base, "text_encoder")
    else:
        raise DataError(f"{base} has no config.json (nor text_encoder/config.json); pass a folder written by "
                        "transformers' save_pretrained, or a diffusers pipeline folder")
    if _has_tokenizer(model):
        return model, model
    parent, name = os.path.split(os.path.normpath(model))
    sibling = os.path.join(parent, name.replace("text_encoder", "tokenizer", 1))
    if name.startswith("text_encoder") and _has_tokenizer(sibling):
        return model, sibling
    raise DataError(f"{model} holds no tokenizer ({', '.join(TOKENIZER_FILES)}); save it beside the model "
                    "(tokenizer.save_pretrained(DIR))")


def _read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError, RecursionError) as err:
        raise DataError(f"cannot read {path} ({one_line(err)}); re-save the folder with save_pretrained") from None
    if not isinstance(data, dict):
        raise DataError(f"{path} is not a JSON object; re-save the folder with save_pretrained")
    return data


def check_safe(model: str, tokenizer: str) -> dict:
    """The model's config.json, once neither folder asks for code of its own and the weights are safetensors."""
    config = _read_json(os.path.join(model, "config.json"))
    files = [os.path.join(model, "config.json"), os.path.join(tokenizer, "tokenizer_config.json")]
    for path in files:
        data = config if path == files[0] else (_read_json(path) if os.path.isfile(path) else {})
        if "auto_map" in data:
            raise DataError(f"{path} asks for code shipped in the folder (auto_map, trust_remote_code), which "
                            "dit-trainer never runs; use a T5, CLIP or Gemma 2 folder that transformers reads itself")
    names = sorted(os.listdir(model))
    if not any(n.endswith(".safetensors") for n in names):
        pickled = [n for n in names if n.endswith(PICKLED)]
        if pickled:
            raise DataError(f"{os.path.join(model, pickled[0])} holds pickled weights, which dit-trainer does not load "
                            "(unpickling can run code); download the model's .safetensors files, or convert on a "
                            "trusted machine (save_pretrained(DIR) writes safetensors)")
        raise DataError(f"{model} holds no .safetensors weights; pass a folder written by save_pretrained")
    return config


def resolve_folders(name) -> Tuple[str, str, str, dict]:
    """(name as recorded, model folder, tokenizer folder, config) of text encoder `name`: a folder
    (recorded as its absolute path) or a Hugging Face id (recorded as given)."""
    name = os.fspath(name)
    folder = os.path.expanduser(name)
    if os.path.isdir(folder):
        name = base = os.path.abspath(folder)
    elif looks_like_path(name):
        raise DataError(f"text encoder folder {name} does not exist; pass a folder saved with save_pretrained or a "
                        "Hugging Face id such as google/t5-v1_1-xxl")
    else:
        base = _hub_folder(name)
    model, tokenizer = _layout(base)
    return name, model, tokenizer, check_safe(model, tokenizer)


def _link_or_copy(src: str, dst: str) -> None:
    """`dst` as a hard link of `src` (weights are never rewritten in place, so a T5-XXL costs no second copy)
    where the file system allows, else a copy."""
    import shutil

    src = os.path.realpath(src)  # the Hugging Face cache holds symlinks to its blobs
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def _copy_files(src: str, dst: str, keep) -> None:
    os.makedirs(dst, exist_ok=True)
    for name in sorted(os.listdir(src)):
        path = os.path.join(src, name)
        if os.path.isfile(path) and not name.endswith(PICKLED) and keep(name):
            _link_or_copy(path, os.path.join(dst, name))


def copy_text_encoder(name, dest) -> dict:
    """Copy text encoder `name` (a folder or Hub id, checked as `load_text_encoder` checks it) into `dest`
    in a diffusers pipeline's layout, `text_encoder/` (config and safetensors) beside `tokenizer/`; returns
    {"model_type": config.json's, "tokenizer_class": the tokenizer's transformers class}."""
    _, model, tokenizer, config = resolve_folders(name)
    weights = (".safetensors", ".safetensors.index.json")
    _copy_files(model, os.path.join(dest, "text_encoder"), lambda n: n == "config.json" or n.endswith(weights))
    _copy_files(tokenizer, os.path.join(dest, "tokenizer"), lambda n: not n.endswith(weights))
    tok_config = os.path.join(tokenizer, "tokenizer_config.json")
    cls = _read_json(tok_config).get("tokenizer_class") if os.path.isfile(tok_config) else None
    if not cls:
        from transformers import AutoTokenizer

        cls = type(AutoTokenizer.from_pretrained(tokenizer, local_files_only=True, trust_remote_code=False)).__name__
    return {"model_type": config.get("model_type"), "tokenizer_class": cls}
