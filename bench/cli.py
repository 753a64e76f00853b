"""Command-line plumbing shared by the scripts: dtype names, the device, --quick defaults."""

from __future__ import annotations

import argparse
from typing import Any, Sequence

import torch

DTYPES = {
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "float32": torch.float32, "fp32": torch.float32,
}
CAUSAL_CHOICES = {"both": [False, True], "true": [True], "false": [False]}


def parse_dtype(name: str) -> torch.dtype:
    """'bf16' / 'bfloat16' -> torch.bfloat16, etc.; unknown names say which are accepted."""
    try:
        return DTYPES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; use one of {', '.join(DTYPES)}") from None


def dtype_name(dtype: torch.dtype) -> str:
    """torch.bfloat16 -> 'bfloat16' (the spelling used in result rows)."""
    return str(dtype).removeprefix("torch.")


def fill_defaults(parser: argparse.ArgumentParser, args: argparse.Namespace, defaults: dict[str, Any],
                  quick: dict[str, Any], dtype_keys: Sequence[str] = ()) -> argparse.Namespace:
    """Unset flags take `quick` (with --quick) or `defaults`, so explicit flags always win; dtype
    flags named in `dtype_keys` are checked and normalised (a bad one exits with the parser's usage)."""
    for key, value in (quick if args.quick else defaults).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    try:
        for key in dtype_keys:
            value = getattr(args, key)
            if isinstance(value, list):
                setattr(args, key, [dtype_name(parse_dtype(v)) for v in value])
            else:
                setattr(args, key, dtype_name(parse_dtype(value)))
    except ValueError as err:
        parser.error(str(err))
    return args


def resolve_device(name: str | None) -> torch.device:
    """None -> cuda when available, else cpu. Asking for cuda without one is an error, not a fallback."""
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda was given but torch sees no CUDA device; use --device cpu for a smoke run")
    return device
