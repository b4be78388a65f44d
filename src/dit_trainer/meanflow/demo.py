"""`dit demo --objective meanflow`: what the digits demo changes to train a one-step generator.

The network, data and post-hoc EMA are the SiT demo's (`demo.demo_config`); these settings replace its
objective, length and sampling. Its samples are drawn by MeanFlow's own sampler at 1 and 2 steps from the
post-hoc EMA of width `MAIN_STD` at the last step, without classifier-free guidance or a guide: the
guidance is folded into training. Torch-free: `dit demo` reads it before building anything.
"""

# A MeanFlow step costs about 1.6x the flow-matching step here (the JVP and a second forward; guidance
# folded in with kappa 0 adds one forward without gradient): benchmarks/meanflow_step.py. Chosen on seeds
# 1 and 2, within the SiT demo's training time (benchmarks/RESULTS.md, "MeanFlow on the digits").
STEPS = 800
SAMPLE_STEPS = (1, 2)  # the sampling step counts the demo scores; the first draws the grid
MAIN_STD = 0.05  # the post-hoc EMA width that samples


def settings(steps: int) -> dict:
    """The config sections that make the SiT demo of `steps` steps a MeanFlow one (merged into demo_config)."""
    return {
        "objective": "meanflow",
        "meanflow": {"omega": 2.0, "kappa": 0.0, "ratio": 0.5, "steps": 1},
        "sample": {"ema_std": MAIN_STD, "steps": 1},
    }
