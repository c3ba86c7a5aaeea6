"""Stand-in of ``aiter/ops/enum.py``: ``QuantType`` (a pybind enum in aiter, same members and order as
``csrc/include/aiter_enum.h``)."""

import enum


class QuantType(enum.IntEnum):
    No = 0
    per_Tensor = 1
    per_Token = 2
    per_1x32 = 3
    per_1x128 = 4
    per_128x128 = 5
    per_256x128 = 6
    per_1024x128 = 7
