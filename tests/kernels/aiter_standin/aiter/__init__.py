"""A stand-in for ``aiter`` (ROCm/aiter) used by CPU CI; see ../README.md. The names below are what
``aiter/__init__.py`` re-exports with ``from .ops.<module> import *``."""

from . import _standin  # noqa: F401
from .ops.enum import QuantType  # noqa: F401
from .ops.gemm_op_a8w8 import gemm_a8w8_blockscale, gemm_a8w8_blockscale_bpreshuffle  # noqa: F401
from .ops.quant import dynamic_per_tensor_quant, get_hip_quant, per_group_quant_hip  # noqa: F401
from .utility import dtypes  # noqa: F401

STANDIN = True
