"""``benchmarks/decode.py``'s command line read into what a run uses: the pass's config (``--without``), the extra
variant (``--also``), Inductor's options (``--inductor``) and the pass's thresholds (``--set``). Each parser exits
with the reason on anything it cannot read, before a model is built."""

from __future__ import annotations

import ast
import functools
import importlib

from fp8_fusion_pass.config import FusionConfig


def pass_config(without: str) -> FusionConfig:
    """The default config with the comma-separated rewrites of ``--without`` switched off."""
    try:
        return FusionConfig.without(without)
    except ValueError as e:
        raise SystemExit(f"--without: {e}") from None


def also_variant(spec: str) -> list[str]:
    """``--also "-norm_rope,+x"`` -> ``["block+pass-norm_rope+x"]`` (a name without a sign switches it on)."""
    items = [item.strip() for item in spec.split(",") if item.strip()]
    return ["block+pass" + "".join(item if item[0] in "+-" else "+" + item for item in items)] if items else []


def inductor_options(spec: str) -> dict:
    """``"combo_kernels=True,coordinate_descent_tuning=True"`` -> ``{name: value}``. Each name must be an
    option of ``torch._inductor.config`` (dotted for its sub-configs: ``triton.cudagraphs``), each value a Python
    literal; anything else exits with the reason."""
    from torch._inductor import config as inductor_config

    options = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, sep, value = (t.strip() for t in item.partition("="))
        if not sep or not name:
            raise SystemExit(f"--inductor: {item!r} is not NAME=VALUE")
        try:
            functools.reduce(getattr, name.split("."), inductor_config)
        except AttributeError:
            raise SystemExit(f"--inductor: torch._inductor.config has no option {name!r}") from None
        try:
            options[name] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            raise SystemExit(f"--inductor: {name}={value!r} is not a Python literal (True, 1, 0.5, 'text')") from None
    return options


def set_thresholds(spec: str) -> dict:
    """``"guards.GQA_MIN_BATCH_HEADS=1,patterns.decode_attention.MAX_ROWS=64"``: each a number the pass decides by
    (``fp8_fusion_pass.<module>.<NAME>``, upper case, an int or float there already), set for the whole run, so a
    guard's alternative is timed without editing it. The pass's cache key reads them (``fusion_pass.thresholds``): a
    graph compiled under one value is never served under another. Returns ``{name: value}``; anything else exits."""
    done = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        target, sep, text = (t.strip() for t in item.partition("="))
        module_name, _, name = target.rpartition(".")
        try:
            module = importlib.import_module(f"fp8_fusion_pass.{module_name}") if sep and module_name else None
        except ImportError:
            module = None
        old = getattr(module, name, None)
        if module is None or not name.isupper() or isinstance(old, bool) or not isinstance(old, (int, float)):
            raise SystemExit(f"--set: {item!r} is not MODULE.NAME=VALUE for a number of fp8_fusion_pass "
                             "(e.g. guards.GQA_MIN_BATCH_HEADS=1)")
        try:
            value = type(old)(text)
        except ValueError:
            raise SystemExit(f"--set: {target} is {type(old).__name__}, not {text!r}") from None
        setattr(module, name, value)
        done[target] = value
    return done
