"""What REPA adds to the layout planner's counts (`dit plan`, `parallel.layout auto`); torch-free.

The projector is a trainable part of the model's head (optimised, EMA'd, sharded like the final
layer); the frozen encoder runs forward only, whole on every rank, its float32 weights replicated.
"""

from dataclasses import replace


def with_alignment(costs, cfg):
    """`costs` (a ModelCosts) with REPA's projector in the last stage and its encoder's forward and weights."""
    from dit_trainer.encoders import encoder_flops, encoder_param_count, shape_of
    from dit_trainer.repa.config import encoder_overrides, encoder_size

    r = cfg.repa
    shape = shape_of(r.encoder, **encoder_overrides(r))
    d, w, z = costs.hidden, r.projector_dim, shape.embed_dim
    weights, biases = d * w + w * w + w * z, 2 * w + z
    last = replace(costs.last, trainable=costs.last.trainable + weights + biases, tensors=costs.last.tensors + 6,
                   matmul=costs.last.matmul + weights + biases)
    size = encoder_size(r, int(round(costs.tokens ** 0.5)))
    # Forward FLOPs per token: the projector's 2 per multiply-add; the encoder's forward per image spread
    # over the tokens and divided by 3, since the planner prices forward + backward as 3 forwards.
    edge = costs.edge_flops + 2 * weights + encoder_flops(shape, size) / costs.tokens / 3
    return replace(costs, last=last, edge_flops=edge,
                   replicated_bytes=costs.replicated_bytes + 4 * encoder_param_count(shape))
