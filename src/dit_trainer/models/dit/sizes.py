"""DiT's named sizes as plain data, free of torch, so other backends (MindSpore) share the table.

`SIZES[size] = (depth, hidden_size, num_heads)`; every size comes with patch 2, 4 and 8, which
gives the release's twelve names ("DiT-S/2" ... "DiT-XL/8").
"""

SIZES = {"S": (12, 384, 6), "B": (12, 768, 12), "L": (24, 1024, 16), "XL": (28, 1152, 16)}
PATCHES = (2, 4, 8)


def dit_size(name: str) -> dict:
    """{"depth", "hidden_size", "num_heads", "patch_size"} of a name like "DiT-S/2" (KeyError if unknown)."""
    family, _, rest = name.partition("-")
    size, _, patch = rest.partition("/")
    if family != "DiT" or size not in SIZES or not patch.isdigit() or int(patch) not in PATCHES:
        raise KeyError(name)
    depth, hidden, heads = SIZES[size]
    return {"depth": depth, "hidden_size": hidden, "num_heads": heads, "patch_size": int(patch)}


NAMES = tuple(f"DiT-{size}/{patch}" for size in SIZES for patch in PATCHES)
