"""The CuTeDSL (Hopper, sm_90a) backend: split-KV decode kernel, combine kernel, launcher.

Importing this package does not import cutlass; the kernels are compiled on first use.
"""

from .backend import CuteBackend, compile_cache_size
from .config_lists import all_combine_configs, all_split_configs
from .configs import CombineConfig, SplitConfig

__all__ = [
    "CombineConfig",
    "CuteBackend",
    "SplitConfig",
    "all_combine_configs",
    "all_split_configs",
    "compile_cache_size",
]
