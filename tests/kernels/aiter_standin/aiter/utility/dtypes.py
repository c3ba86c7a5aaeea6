"""Stand-in of ``aiter/utility/dtypes.py`` (exported as ``aiter.dtypes``). ``fp8`` follows ``_standin.set_gfx``;
the real module evaluates it once at import from ``rocminfo``."""

import torch

fp8 = torch.float8_e4m3fn  # gfx950 until set_gfx says otherwise
fp16 = torch.float16
bf16 = torch.bfloat16
fp32 = torch.float32
i8 = torch.int8
u8 = torch.uint8
