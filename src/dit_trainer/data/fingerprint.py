"""An image folder's fingerprint, saved with a checkpoint's data position so a resume can tell
whether it reads the images the run read: the folder, its image count and the cache's digest of
every file's path, label, size, mtime, ctime and inode (`online.cache.files_digest`)."""

from typing import Dict, Optional


def fingerprint(data_path: str, num_images: int, files_sha256: str) -> Dict:
    """What a checkpoint records of the image folder it trained on."""
    return {"data_path": data_path, "images": int(num_images), "files_sha256": files_sha256}


def changes(saved: Optional[Dict], now: Optional[Dict]) -> Optional[str]:
    """What changed between a checkpoint's fingerprint and the data's now, in words; None when nothing
    did, or when either side has none (a checkpoint of older versions, data of another kind)."""
    if not isinstance(saved, dict) or not isinstance(now, dict):
        return None
    if saved.get("files_sha256") == now.get("files_sha256"):
        return None
    where = f"the image folder {now.get('data_path')}"
    if saved.get("data_path") != now.get("data_path"):
        where += f" (the checkpoint trained on {saved.get('data_path')})"
    if saved.get("images") != now.get("images"):
        return f"{where} holds {now.get('images')} images, the checkpoint's run read {saved.get('images')}"
    return (f"{where} changed since the checkpoint: as many images ({now.get('images')}), but an image was "
            "replaced, edited, renamed or relabelled (a size, time or inode differs)")
