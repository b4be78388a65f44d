"""What a model family tells the layout planner (`dit plan`): parameter counts, the work of a
block, and the activations a block keeps for its backward under each checkpointing policy.

Plain arithmetic on the model's sizes, no torch: the planner prices a 7B model on a laptop.
Activations are counted per token of one block, split by dtype and by whether tensor
parallelism divides them; the planner multiplies by tokens, blocks and in-flight micro-batches.
"""

from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class PerToken:
    """Elements per token by width: float32, the residual stream's, the activation dtype's (whole
    on every tensor-parallel rank or split across them)."""

    fp32: float = 0.0  # float32 elements on every tp rank (norm outputs, modulated inputs)
    resid: float = 0.0  # residual-stream elements: float32, or bf16 where FSDP's mixed precision casts block inputs
    act: float = 0.0  # activation-dtype elements (bf16 under autocast) on every tp rank
    act_tp: float = 0.0  # activation-dtype elements split across the tp ranks (heads, MLP width)

    def nbytes(self, act_bytes: int, tp: int = 1, resid_bytes: int = 4) -> float:
        """Bytes per token on one rank of `tp`, activations `act_bytes` and the residual `resid_bytes` wide."""
        return 4 * self.fp32 + resid_bytes * self.resid + act_bytes * (self.act + self.act_tp / tp)

    def elements(self, tp: int = 1) -> float:
        """Elements per token on one rank of `tp`."""
        return self.fp32 + self.resid + self.act + self.act_tp / tp

    def __add__(self, other: "PerToken") -> "PerToken":
        return PerToken(self.fp32 + other.fp32, self.resid + other.resid, self.act + other.act,
                        self.act_tp + other.act_tp)

    def __mul__(self, k: float) -> "PerToken":
        return PerToken(self.fp32 * k, self.resid * k, self.act * k, self.act_tp * k)


@dataclass(frozen=True)
class Params:
    """Parameter counts of a part of the model (one block, the embedders, the head)."""

    trainable: int = 0  # elements that get gradients and AdamW state
    frozen: int = 0  # elements kept with the weights and EMA only (DiT's pos_embed)
    tensors: int = 0  # trainable tensors (AdamW keeps one step count per tensor)
    tp_split: int = 0  # of `trainable`, elements tensor parallelism divides
    matmul: int = 0  # of `trainable`, elements autocast casts to the activation dtype (weights of Linear/Conv)

    def local(self, tp: int) -> float:
        """Trainable elements one tensor-parallel rank holds."""
        return self.trainable - self.tp_split + self.tp_split / tp


@dataclass(frozen=True)
class ModelCosts:
    """A model's counts for the planner; every `PerToken` is per token of one block unless named otherwise.

    `saved[policy]` is what a block keeps for its backward under `train.activation_checkpointing`
    (`none`, `full`, `selective`) on the CPU matmul-attention path; `fused_attention` is what a
    fused attention kernel (CUDA, or float32) keeps on top under `none` and `selective`.
    `compiled_input` and `compiled_items` describe a compiled block: it always keeps its input,
    and under `train.activation_memory_budget` b it keeps the items in order while they fit
    in input + b x (all items), as PyTorch's partitioner keeps costly-to-recompute tensors first.
    `scores` is one attention score matrix (heads x tokens), a transient of the matmul path.
    """

    name: str
    depth: int
    tokens: int  # tokens per image
    hidden: int  # width of the residual stream
    heads: int
    block: Params
    first: Params  # embedders: on the first pipeline stage
    last: Params  # final layer: on the last pipeline stage
    block_flops: float  # forward FLOPs per token of one block that tensor parallelism divides
    block_flops_per_image: float  # forward FLOPs per image of one block that it does not (adaLN)
    edge_flops: float  # forward FLOPs per token of the embedders and the head together
    saved: dict  # policy -> PerToken
    fused_attention: PerToken
    compiled_input: PerToken
    compiled_items: tuple  # PerToken, kept first to last
    scores: PerToken
    transient: PerToken  # what one block's backward allocates besides the scores
    edge_saved: PerToken  # what the embedders and head keep, per token of the image
    boundary: PerToken  # what one pipeline stage hands the next, per token
    tp_allreduce: PerToken  # what one of tensor parallelism's all-reduces carries, per token
    elementwise: dict = field(default_factory=dict)  # op class -> elements per token of one block, forward
    tp_divides: tuple = ()  # counts `parallel.tp` must divide
    tp_modules: int = 0  # modules of a block tensor parallelism wraps (each adds DTensor dispatch)
    tp_allreduces: tuple = (2, 2)  # all-reduces of one block's (forward, backward) under tensor parallelism
    attention_share: float = 1.0  # a block's attention work over a full block's, averaged over blocks (token routing)
    replicated_bytes: float = 0.0  # weights every rank holds whole beside the model, never trained (REPA's frozen encoder)
    sharded_frozen_bytes: float = 0.0  # frozen weights beside the model that FSDP shards over dp_shard, whole without it (an online text encoder)
    sharded_frozen_params: int = 0  # their parameter count

    @property
    def trainable(self) -> int:
        return self.first.trainable + self.last.trainable + self.depth * self.block.trainable

    @property
    def frozen(self) -> int:
        return self.first.frozen + self.last.frozen + self.depth * self.block.frozen

    @property
    def tensors(self) -> int:
        return self.first.tensors + self.last.tensors + self.depth * self.block.tensors

    def with_depth(self, depth: int) -> "ModelCosts":
        """The same model with another number of blocks."""
        return replace(self, depth=depth)

    def routed(self, tokens_per_block) -> "ModelCosts":
        """The work of a run whose blocks compute on `tokens_per_block` tokens per image (token routing),
        averaged over the blocks: weights scale with a block's share of the tokens, attention with its
        square. What the blocks keep for the backward is left at every token's (an upper bound)."""
        shares = [t / self.tokens for t in tokens_per_block]
        linear, square = sum(shares) / len(shares), sum(s * s for s in shares) / len(shares)
        attention = 4 * self.tokens * self.hidden
        return replace(self, block_flops=(self.block_flops - attention) * linear + attention * square,
                       attention_share=square,
                       elementwise={k: v * (square if k == "softmax" else linear) for k, v in self.elementwise.items()})


def transformer_costs(name, depth, tokens, hidden, heads, block, first, last, token_weights, **family) -> ModelCosts:
    """ModelCosts of a DiT-like transformer: what every such family shares (blocks of `token_weights`
    weights per token plus attention, a fused-attention kernel's and a compiled block's saved input,
    the residual stream between stages, one activation-wide TP all-reduce), and the `family`'s own fields."""
    d = hidden
    return ModelCosts(
        name=name, depth=depth, tokens=tokens, hidden=d, heads=heads, block=block, first=first, last=last,
        block_flops=2 * token_weights + 4 * tokens * d,
        # A fused kernel keeps its output and a float32 log-sum-exp per head.
        fused_attention=PerToken(fp32=heads, act_tp=d),
        compiled_input=PerToken(resid=d),
        scores=PerToken(act_tp=heads * tokens),
        boundary=PerToken(resid=d),
        tp_allreduce=PerToken(act=d),
        **family,
    )


def with_time_embedders(costs, cfg, width: int, frequency: int = 256) -> ModelCosts:
    """`costs` with the timestep-shaped embedders (sinusoid of `frequency`, an MLP `width` wide) that the
    objective of `cfg` adds beside t, on the first stage: MeanFlow's interval h and its guidance scale w."""
    from dit_trainer.objective import takes_guidance_scale, takes_interval

    count = int(takes_interval(cfg)) + int(takes_guidance_scale(cfg))
    if not count:
        return costs
    weights = frequency * width + width * width
    params = count * (weights + 2 * width)
    first = replace(costs.first, trainable=costs.first.trainable + params, tensors=costs.first.tensors + 4 * count,
                    matmul=costs.first.matmul + params)
    # Once per image, like t's MLP: spread over the tokens.
    return replace(costs, first=first, edge_flops=costs.edge_flops + count * 2 * weights / costs.tokens)
