"""GPT-2 with a switchable attention (gpt.py, attention.py) and its FLOP accounting (flops.py)."""

import kernels  # noqa: F401  first: picks Triton's backend before the FLOP counter imports triton
from model.attention import ATTENTION, get_attention
from model.gpt import GPT, GPTConfig

__all__ = ["ATTENTION", "GPT", "GPTConfig", "get_attention"]
