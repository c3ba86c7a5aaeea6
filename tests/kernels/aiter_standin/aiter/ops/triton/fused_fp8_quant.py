"""The pre-v0.1.10 path ``aiter.ops.triton.fused_fp8_quant`` (HEAD maps it to ``quant.fused_fp8_quant``)."""

from .quant.fused_fp8_quant import fused_rms_fp8_group_quant  # noqa: F401
