"""benchmarks/demo_guidance.py: its rows go from no guidance on the raw weights to the demo's own mix."""

import importlib.util
from pathlib import Path

from dit_trainer.demo import recommended_sampling
from dit_trainer.sample.sweep import parse_spec

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "demo_guidance.py"


def _load():
    import sys

    sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("demo_guidance", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_spec_parses_and_the_last_is_the_demos_recommendation():
    specs = _load().specs("G")
    parsed = [parse_spec(s) for s in specs]
    assert parsed[0] == {"cfg_scale": 1.0, "ema_std": "none"}
    demo = recommended_sampling("transport")
    last = parsed[-1]
    assert (last["cfg_scale"], last["guide_scale"], last["guidance_interval"], float(last["ema_std"])) == (
        demo["cfg_scale"], demo["guide_scale"], demo["guidance_interval"], demo["ema_std"])
    assert all(p.get("guide") in (None, "G") for p in parsed)
