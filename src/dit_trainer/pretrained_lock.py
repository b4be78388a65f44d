"""One lock for building a model from a saved folder (transformers' and diffusers' `from_pretrained`).

While they build a model, both libraries swap class-wide functions for no-ops and put them back after:
transformers `PreTrainedModel.tie_weights` and torch's `nn.init` functions, diffusers the `nn.init`
functions. Two loads at once in one process (ranks run as threads, or a loader thread beside the main
one) can each put back what the other swapped in, and leave the no-op for the rest of the process:
every T5 built or loaded after that has an untied embedding table, every new layer uninitialised.
Holding this lock around each load keeps them one at a time; it is reentrant, since a pipeline's load
can load its parts.
"""

import threading

PRETRAINED_LOCK = threading.RLock()
