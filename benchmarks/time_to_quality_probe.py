"""The bookkeeping of benchmarks/time_to_quality.py's probe: which recipes still need probing beside the
baseline, and each recipe's seconds per step from the rounds it was probed in.

A probe's seconds per step mean something only beside the baseline's from the same interleaved rounds:
the load of a shared machine changes between sittings. Probes are kept as groups, each the recipes
probed together (with the config overrides each had) and their medians. The first group holding the
baseline sets the budget. A recipe added to a measurement later is probed in a new group together
with the baseline again, and its seconds per step are its ratio to the baseline within that group
times the baseline's in the first group; the runs already trained keep their budget.
"""

from time_to_quality_keys import canonical
from time_to_quality_recipes import BASELINE


def median(values) -> float:
    """The middle value (the upper one of an even count), as the probe has always taken it."""
    values = sorted(values)
    if not values:
        raise ValueError("no timed windows: raise the probe's steps or lower its log steps")
    return values[len(values) // 2]


def holds(group: dict, recipe: str, overrides: dict) -> bool:
    """Whether `group` probed `recipe` with these config overrides."""
    return recipe in group["recipes"] and canonical(group["recipes"][recipe]) == canonical(overrides)


def still_to_probe(groups: list, overrides: dict) -> list:
    """The recipes (keys of `overrides`, the baseline first) to probe together next: every one when no group
    holds the baseline, else the baseline and those no group holds; [] when all are held."""
    recipes = [BASELINE] + [r for r in overrides if r != BASELINE]
    if not any(holds(g, BASELINE, overrides[BASELINE]) for g in groups):
        return recipes
    missing = [r for r in recipes[1:] if not any(holds(g, r, overrides[r]) and holds(g, BASELINE, overrides[BASELINE])
                                                  for g in groups)]
    return [BASELINE, *missing] if missing else []


def speeds(groups: list, overrides: dict) -> dict:
    """{recipe: {"s_per_step", "group", "probed_s_per_step", "baseline_in_group"}} of every recipe of
    `overrides`: from the first group holding it beside the baseline, scaled to the first group's baseline."""
    base = overrides[BASELINE]
    with_base = [(i, g) for i, g in enumerate(groups) if holds(g, BASELINE, base)]
    if not with_base:
        raise ValueError("no probe holds the baseline")
    reference = with_base[0][1]["s_per_step"][BASELINE]
    out = {}
    for recipe, o in overrides.items():
        i, g = next(((i, g) for i, g in with_base if holds(g, recipe, o)), (None, None))
        if g is None:
            raise ValueError(f"no probe holds {recipe} beside the baseline")
        probed, beside = g["s_per_step"][recipe], g["s_per_step"][BASELINE]
        out[recipe] = {"s_per_step": probed / beside * reference, "group": i, "probed_s_per_step": probed,
                       "baseline_in_group": beside}
    return out
