"""`dit demo --objective meanflow`: what the digits demo changes to train a one-step generator.

The data and post-hoc EMA are the SiT demo's (`demo.demo_config`), its network narrowed from width 192 to
128; these settings replace its objective, width, length, learning-rate schedule and sampling. Its samples
are drawn by MeanFlow's own sampler at 1 and 2 steps from the post-hoc EMA of width `MAIN_STD` at the last
step, without classifier-free guidance or a guide: the guidance is folded into training. Torch-free: `dit demo` reads it
before building anything.
"""

# A MeanFlow step of these settings costs about 2.1x the flow-matching step here (benchmarks/meanflow_step.py,
# "demo difference"): the loss's forward and backward, one forward without gradient for the
# unconditional velocity (omega 1.1, kappa 0), and on the 75% of samples with r != t one for the tangent
# (the network's own velocity, improved MeanFlow's) and two for du/dt (the central difference costs less than
# the JVP's dual tensors on a CPU), so the SiT demo's 1,200 steps at batch 64 buy 1,110 of them at batch 32
# at the SiT demo's width. Width 128 costs 0.55x that step (benchmarks/meanflow_step.py, "demo difference width
# 128"), but not the loop's own share (data, post-hoc EMA), so 1,800 steps train in the time 1,110 did; the
# updates gained outweigh the width lost: at 1,110 steps width 128 scored as well as 192 (seed 1: 1-step FID 15.5
# against 16.0), and at 1,850-2,050 steps both step counts improved on seeds 1 and 2 (benchmarks/RESULTS.md).
# Guidance omega 1.1: omega 2 (an effective classifier-free scale of 2) halved the samples' recall and took
# 1-step FID to 56; omega 1 leaves a tenth of the 1-step digits unrecognised. Under the cosine schedule, on
# seeds 1 and 2, omega 1.1 took the 1-step FID from 8.9 and 9.2 (omega 1.15) to 8.1 and 8.1 with 96-97%
# recognised, and omega 1.25 to 12.4 and 10.5. The predicted tangent at 1,110 steps against the sample's at
# 1,280 (the same training time), seeds 1 and 2: 2-step FID 12.2 and 8.3 against 11.8 and 11.8, 1-step 14.5
# and 13.4 against 12.1 and 16.0 (benchmarks/RESULTS.md, "MeanFlow on the digits").
STEPS = 1800
WIDTH = 128
BATCH = 32  # half the SiT demo's: at equal samples seen, twice the updates (1-step FID 12 against 19 at batch 64)
SAMPLE_STEPS = (1, 2)  # the sampling step counts the demo scores; the first draws the grid
# Each step count's schedule (paper's t, noise at 1). Two steps stop at t = 0.75, not halfway: on seeds 1 and 2
# the 2-step FID at midpoints 0.3..0.9 was lowest at 0.7-0.75 (9.9 and 7.5 against 12.2 and 8.3 halfway).
SCHEDULES = {1: (1.0, 0.0), 2: (1.0, 0.75, 0.0)}
MAIN_STD = 0.05  # the post-hoc EMA width that samples


def settings(steps: int) -> dict:
    """The config keys that make the SiT demo of `steps` steps a MeanFlow one (merged into demo_config's sections)."""
    return {
        "objective": "meanflow",
        "meanflow": {"omega": 1.1, "kappa": 0.0, "ratio": 0.75, "jvp": "difference", "tangent": "predicted",
                     "steps": 1},
        "train": {"global_batch_size": BATCH},
        "model": {"hidden_size": WIDTH},
        # Cosine decay to 0 after the SiT demo's warmup: on seeds 1 and 2 the 1-step FID fell from 11.9 and 12.6
        # (constant rate) to 8.9 and 9.2, the 2-step FID stayed under 8 (5.0 -> 7.6, 7.7 -> 7.2); a linear
        # cooldown over the last 30% gave 13.8 and 9.7 (benchmarks/RESULTS.md).
        "optim": {"lr_schedule": "cosine"},
    }


def sampling() -> dict:
    """The `sample:` section the MeanFlow demo records: one step from the post-hoc EMA, guidance trained in."""
    return {"ema_std": MAIN_STD, "steps": 1}
