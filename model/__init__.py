"""GPT-2 with a switchable attention (gpt.py, attention.py) and its FLOP accounting (flops.py)."""

from model.attention import ATTENTION, get_attention
from model.gpt import GPT, GPTConfig

__all__ = ["ATTENTION", "GPT", "GPTConfig", "get_attention"]
