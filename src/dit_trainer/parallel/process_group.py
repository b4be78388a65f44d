"""Joining torchrun's process group so that it forms again after an elastic restart.

Under torchrun's c10d rendezvous (and `--standalone`) the workers' default group lives in a
TCPStore the rank-0 agent keeps for the whole launch. Its keys (each rank's address, the group's
sequence numbers) are the same at every restart, so restarted ranks read the previous round's
entries and dial dead processes: gloo's connect hangs or fails, NCCL gets a stale unique id
(pytorch issues 167288 and 135712). `TORCHELASTIC_RESTART_COUNT` cannot tell the rounds apart
either: each agent counts only the failures it saw, so two nodes disagree after a restart.

Here rank 0 draws a new attempt number from the store (a counter: 1, 2, ... per store), hands it
to every other rank in answer to a random token that rank has just written (so no answer of an
earlier round can be mistaken for this one's), and the group is built under a store prefix of
that attempt. A store created for this launch alone (static rendezvous, plain env://) needs
none of this and gets torch's own `init_process_group`.
"""

import os
import time
import uuid
from datetime import timedelta
from typing import Optional

_HELLOS = "dit_trainer/hellos"
_ATTEMPTS = "dit_trainer/attempts"
# The attempt this process's group was formed in (1 for the launch's first), None before or outside torchrun's store.
_attempt: Optional[int] = None


def init_process_group(backend: str, timeout: Optional[timedelta] = None) -> None:
    """Join the default process group of this torchrun launch (`timeout`: the group's, None for torch's default)."""
    import torch.distributed as dist

    global _attempt
    if dist.is_initialized():
        return
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        dist.init_process_group(backend, timeout=timeout)
        return
    wait = timeout or dist.default_pg_timeout
    store, rank, world_size = next(dist.rendezvous("env://", timeout=wait))
    store.set_timeout(wait)
    _attempt = agree_on_attempt(store, rank, world_size, wait)
    # A key space of this attempt alone: nothing an earlier round's ranks wrote is read.
    dist.init_process_group(backend, store=dist.PrefixStore(f"dit_trainer/attempt{_attempt}", store), rank=rank,
                            world_size=world_size, timeout=timeout)


def agree_on_attempt(store, rank: int, world_size: int, timeout: timedelta) -> int:
    """A number that every rank of this round gets alike and no earlier round had: rank 0 draws it, the
    others ask for it with a fresh token (an answer to their token can only come from this round)."""
    if rank == 0:
        number = store.add(_ATTEMPTS, 1)
        _answer(store, number, world_size, timeout)
        return number
    token = uuid.uuid4().hex
    store.append(_HELLOS, token + ",")
    try:
        number = int(store.get(f"dit_trainer/answer/{token}"))
    except RuntimeError as err:  # the store's timeout: rank 0 never answered
        raise RuntimeError(f"rank {rank}: rank 0 did not start within {timeout}; see its log ({err})") from None
    store.add(f"dit_trainer/attempt{number}/joined", 1)
    return number


def _answer(store, number: int, world_size: int, timeout: timedelta) -> None:
    """Rank 0: answer every token written so far (earlier rounds' too: harmless) until all the others joined."""
    joined = f"dit_trainer/attempt{number}/joined"
    answered = set()
    deadline = time.monotonic() + timeout.total_seconds()
    while store.add(joined, 0) < world_size - 1:
        tokens = store.get(_HELLOS).decode().split(",") if store.check([_HELLOS]) else []
        for token in filter(None, tokens):
            if token not in answered:
                store.set(f"dit_trainer/answer/{token}", str(number))
                answered.add(token)
        if time.monotonic() > deadline:
            missing = world_size - 1 - store.add(joined, 0)
            raise RuntimeError(f"rank 0: {missing} of the {world_size - 1} other ranks did not start within {timeout}; "
                               "see their logs")
        time.sleep(0.02)


def restarts() -> Optional[int]:
    """How many times torchrun restarted this launch's workers, or None outside torchrun: the store's attempt
    count, or this agent's own count where that is higher (a lost rank-0 node takes the store with it)."""
    if "TORCHELASTIC_RESTART_COUNT" not in os.environ:
        return None
    return max((_attempt or 1) - 1, int(os.environ["TORCHELASTIC_RESTART_COUNT"]))


def resume_record(checkpoint, world_size: int) -> Optional[dict]:
    """The metrics.jsonl record of a resume under torchrun (the checkpoint, the world it resumed into, torchrun's
    restarts), where a restart resumes without anyone rerunning; None outside torchrun."""
    if restarts() is None:
        return None
    return {"event": "resumed", "checkpoint": checkpoint.name, "world_size": world_size, "restart": restarts()}
