"""One typed config for every command: dataclass sections (`schema`), YAML/JSON files and
`--section.field value` overrides (`load`), the allowed values (`checks`), model files including
PaddleMIX's DiT JSON (`model_file`), and the reference `dit train --help` prints (`doc`).

Torch-free: the MindSpore backend and `dit --help` read configs without importing torch.
"""

from dit_trainer.config.load import (
    backend_of,
    build_config,
    config_yaml,
    flatten,
    given_keys,
    parse_overrides,
    read_settings,
    save_config,
    set_key,
)
from dit_trainer.config.schema import (
    RETIRED_KEYS,
    RFC_KEYS,
    SECTIONS,
    CheckpointConfig,
    Config,
    DataConfig,
    DiffusionConfig,
    LoggingConfig,
    ModelConfig,
    OptimConfig,
    ParallelConfig,
    SampleConfig,
    TrainConfig,
    all_keys,
)
from dit_trainer.transport.config import TransportConfig

__all__ = [
    "RETIRED_KEYS", "RFC_KEYS", "SECTIONS", "CheckpointConfig", "Config", "DataConfig", "DiffusionConfig",
    "LoggingConfig", "ModelConfig", "OptimConfig", "ParallelConfig", "SampleConfig", "TrainConfig", "TransportConfig", "all_keys",
    "backend_of", "build_config", "config_yaml", "flatten", "given_keys", "parse_overrides", "read_settings",
    "save_config", "set_key",
]
