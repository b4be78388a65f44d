"""`parallel.layout auto`: the planner's top layout for the launched world size, written into the config."""

import os

from dit_trainer.errors import ConfigError


def _machine(device_type: str, world: int) -> tuple:
    """(gpus per node, memory GiB of one device) of the machine this process runs on."""
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if device_type == "cuda":
        import torch

        return per_node, torch.cuda.get_device_properties(0).total_memory / 2**30
    # Processes of one host share its memory (the request divides it among them).
    return per_node, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def apply_auto_layout(cfg, world_size=None, hardware=None, gpus_per_node=None, gpu_memory_gib=None):
    """Rewrite `cfg`'s parallel degrees, schedule, micro-batches, AC and compile to the top plan for
    `world_size` ranks (default: torchrun's WORLD_SIZE) and return that Plan; `parallel.layout`
    becomes `manual`, so the run's config.yaml, and a resume, keep the chosen layout."""
    from dit_trainer.devices import resolve_device
    from dit_trainer.plan.hardware import detect_hardware, load_hardware
    from dit_trainer.plan.search import make_request, plan_layouts

    from dit_trainer.devices import compile_supported

    world = int(world_size or os.environ.get("WORLD_SIZE", "1"))
    resolved = resolve_device(cfg.train.device)
    device = resolved.type
    if cfg.train.compile == "auto" and not compile_supported(resolved):
        cfg.train.compile = "false"  # as `auto` would decide here: no compiler for this device
    per_node, memory = _machine(device, world)
    hw = load_hardware(hardware) if hardware is not None else detect_hardware(device)
    request = make_request(cfg, world, gpus_per_node or per_node, hw, gpu_memory_gib or memory)
    plans = plan_layouts(request)
    best = plans[0]
    if not best.fits:
        raise ConfigError(f"parallel.layout auto: no layout of {cfg.model.name} at train.global_batch_size "
                          f"{cfg.train.global_batch_size} fits {world} x {hw.name}; the smallest {best.overflow()}; "
                          "lower the batch or add devices (dit plan lists the layouts)")
    best.layout.apply(cfg)
    cfg.parallel.layout = "manual"
    return best
