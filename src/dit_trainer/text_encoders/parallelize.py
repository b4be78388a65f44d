"""A frozen text encoder sharded over the data-parallel ranks (FSDP2, inference only).

A T5-XXL is 4.7B parameters (9.5 GB in bf16): whole on every rank it takes what the model's own
sharding saved. Training that encodes captions online (an image folder with `data.text_encoder`)
under an FSDP layout shards the encoder over the `dp_shard` mesh as the model is sharded: each
transformer block, then the rest, gathered for its forward and freed after. It is never trained,
optimised or checkpointed (it lives in the data's loader, not the model). Its forward is then a
collective: `TextEncoder.group` names the group, and `data.encode.encode_text_rows` makes every rank
of it call the encoder as often (ranks with fewer captions encode "" until all are done).
"""

from functools import reduce

# config kind -> the attribute path of its repeated blocks in the loaded transformers model
BLOCKS = {"t5": "encoder.block", "clip": "text_model.encoder.layers", "gemma2": "layers"}


def blocks_of(encoder) -> list:
    """The repeated transformer blocks of a `TextEncoder`'s model."""
    return list(reduce(getattr, BLOCKS[encoder.kind].split("."), encoder.model))


def shard_text_encoder(encoder, mesh):
    """`encoder` (a `TextEncoder`, on the rank's device) sharded over `mesh` in place; returns it."""
    from dit_trainer.parallel.parallelize import shard_frozen

    shard_frozen(encoder.model, blocks_of(encoder), mesh)
    encoder.group = mesh.get_group()
    return encoder


def agreed_calls(encoder, calls: int) -> int:
    """The most encoder calls any rank of `encoder.group` makes now (`calls` for an encoder not sharded)."""
    group = getattr(encoder, "group", None)
    if group is None:
        return calls
    import torch
    import torch.distributed as dist

    count = torch.tensor([calls], dtype=torch.int64, device=encoder.device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX, group=group)
    return int(count.item())

