"""What REPA adds to the layout planner's counts (`dit plan`, `parallel.layout auto`).

The projector is a trainable part of the model's head (optimised, EMA'd, sharded like the final
layer); the frozen encoder runs forward only, whole on every rank, its float32 weights replicated.
"""

from dataclasses import replace

from dit_trainer.models.costs import Params


def _meta_encoder(r):
    import torch

    from dit_trainer.encoders import build_encoder

    # On the meta device: the sizes without allocating the weights.
    with torch.device("meta"):
        return build_encoder(r.encoder, **dict(r.encoder_overrides))


def with_alignment(costs, cfg):
    """`costs` (a ModelCosts) with REPA's projector in the last stage and its encoder's forward and weights."""
    from dit_trainer.encoders import encoder_flops, encoder_param_count
    from dit_trainer.repa.encoder import encoder_size

    r = cfg.repa
    encoder = _meta_encoder(r)
    d, w, z = costs.hidden, r.projector_dim, encoder.embed_dim
    weights = d * w + w * w + w * z
    biases = 2 * w + z
    last = costs.last
    last = Params(trainable=last.trainable + weights + biases, frozen=last.frozen, tensors=last.tensors + 6,
                  tp_split=last.tp_split, matmul=last.matmul + weights + biases)
    size = encoder_size(r, int(round(costs.tokens ** 0.5)))
    # Forward FLOPs per token: the projector's 2 per multiply-add; the encoder's forward per image spread
    # over the tokens and divided by 3, since the planner prices forward + backward as 3 forwards.
    edge = costs.edge_flops + 2 * weights + encoder_flops(encoder, size) / costs.tokens / 3
    return replace(costs, last=last, edge_flops=edge,
                   replicated_bytes=costs.replicated_bytes + 4 * encoder_param_count(encoder))
