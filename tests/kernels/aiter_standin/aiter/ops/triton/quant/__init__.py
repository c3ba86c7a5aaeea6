from .fused_fp8_quant import fused_rms_fp8_group_quant  # noqa: F401
