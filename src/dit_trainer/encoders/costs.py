"""What the frozen encoder costs: forward FLOPs per image, parameters and their bytes, for `dit plan`
and the MFU log. Plain arithmetic on the sizes, no torch, like models/costs.py.

FLOPs are counted as models/flops.py counts the denoiser (2 per multiply-add of every matmul and
convolution; attention's QKᵀ and AV at 2·2·T²·D per block) but forward only: the encoder runs under
no_grad. T counts the class and register tokens with the patches. Norms, GELU and softmax are not
counted, as for the denoiser.
"""

from dit_trainer.encoders.registry import shape_of
from dit_trainer.encoders.shape import VitShape, swiglu_hidden

_DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2}


def _shape(encoder) -> VitShape:
    """The VitShape of an Encoder, an encoder name or a VitShape."""
    if isinstance(encoder, str):
        return shape_of(encoder)
    return encoder if isinstance(encoder, VitShape) else encoder.shape


def _block_matmul(shape: VitShape) -> int:
    """Weight elements of one block's matmuls (qkv, proj, FFN)."""
    dim = shape.embed_dim
    ffn = 3 * dim * swiglu_hidden(dim, shape.mlp_ratio) if shape.swiglu else 2 * dim * int(dim * shape.mlp_ratio)
    return 4 * dim * dim + ffn


def encoder_flops(encoder, size: int) -> float:
    """Forward FLOPs of one size×size image through `encoder` (an Encoder, an encoder name or a VitShape)."""
    shape = _shape(encoder)
    patches = (size // shape.patch_size) ** 2
    tokens = patches + 1 + shape.num_register_tokens
    embed = shape.embed_dim * shape.in_chans * shape.patch_size ** 2
    per_block = 2 * _block_matmul(shape) * tokens + 4 * tokens * tokens * shape.embed_dim
    return float(2 * embed * patches + shape.depth * per_block)


def encoder_param_count(encoder) -> int:
    """Parameters of `encoder` (an Encoder, an encoder name or a VitShape)."""
    shape = _shape(encoder)
    dim = shape.embed_dim
    grid = shape.img_size // shape.patch_size
    hidden = swiglu_hidden(dim, shape.mlp_ratio) if shape.swiglu else int(dim * shape.mlp_ratio)
    ffn_bias = 2 * hidden + dim if shape.swiglu else hidden + dim
    # qkv and proj biases, two norms, two layer scales
    block = _block_matmul(shape) + 4 * dim + 4 * dim + 2 * dim + ffn_bias
    embed = dim * shape.in_chans * shape.patch_size ** 2 + dim
    tokens = dim * (grid * grid + 1) + dim + shape.num_register_tokens * dim + dim  # pos, cls, registers, mask
    return embed + tokens + shape.depth * block + 2 * dim


def encoder_param_bytes(encoder, dtype="fp32") -> int:
    """Bytes of `encoder`'s parameters stored in `dtype` ("fp32", "bf16", a torch dtype or a byte count)."""
    if isinstance(dtype, int):
        width = dtype
    elif hasattr(dtype, "itemsize"):
        width = dtype.itemsize
    else:
        width = _DTYPE_BYTES[str(dtype).lower()]
    return encoder_param_count(encoder) * width
