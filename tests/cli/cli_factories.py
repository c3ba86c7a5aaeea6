"""MODEL factories for the CLI tests (``cli_factories:<name>``); the directory is put on PYTHONPATH."""

from __future__ import annotations

import torch


def not_a_module():
    return 42


def raises():
    raise RuntimeError("factory exploded on purpose")


class _TwoLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.a(x).relu()


def module_and_inputs():
    return _TwoLinear(), (torch.randn(2, 8),)


def module_only():  # no example inputs and no config.vocab_size: the CLI must ask for inputs
    return _TwoLinear()
