"""One msrun worker (or a plain process): 3 steps of the MICRO model over a latent folder; prints
the global loss and a checksum of the final weights. Used by test_msrun.py."""

import os
import sys

import numpy as np

from dit_trainer_mindspore.engine import MindSporeTrainer

data, out, jit = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
cfg = {"model_name": "DiT-S/2", "input_size": 4, "num_classes": 4, "mixed_precision": "fp32",
       "model": {"depth": 1, "hidden_size": 32, "num_heads": 2}, "data_path": data, "batch_size": 4,
       "max_steps": 3, "output_dir": out, "lr": 1e-3, "train": {"compile": jit},
       "checkpoint": {"resume": False, "save_steps": 100}}
eng = MindSporeTrainer(cfg)
result = eng.train()
weights = np.concatenate([p.asnumpy().ravel() for p in eng.model.get_parameters()])
print(f"RESULT rank={os.environ.get('RANK_ID', '-')} loss={result['loss']!r} sum={float(np.abs(weights).sum())!r}",
      flush=True)
