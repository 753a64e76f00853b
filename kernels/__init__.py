"""Attention kernels: our Triton FlashAttention (forward and backward, package flash_attn), the
FLOP formulas (flops) and the float64 reference (reference).

Triton decides when a kernel is *defined* whether it will compile it for a GPU or run it in its
CPU interpreter (TRITON_INTERPRET=1), and its own library functions (tl.zeros, tl.sum, …) are
defined when `triton` is first imported. Without CUDA we therefore switch the interpreter on
here, before anything imports triton, and log it: that is what lets the project run on a laptop.
"""
import logging
import os
import sys

import torch


def _select_triton_backend() -> None:
    # an explicit TRITON_INTERPRET (1, or 0 to compile for a GPU target without one, as
    # scripts/kernel_resources.py does) is the user's choice
    if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "") != "":
        return
    if "triton" in sys.modules:
        raise ImportError(
            "No CUDA device, so our Triton kernels must run in Triton's CPU interpreter, but triton "
            "was already imported without TRITON_INTERPRET=1 (torch.compile and "
            "torch.utils.flop_counter import it). Import `kernels` before those, or run with "
            "TRITON_INTERPRET=1 set in the environment."
        )
    os.environ["TRITON_INTERPRET"] = "1"
    logging.getLogger(__name__).warning("no CUDA device: running Triton kernels in the CPU interpreter (TRITON_INTERPRET=1, slow)")


_select_triton_backend()

from kernels.flash_attn import flash_attention, flash_attn_backward, flash_attn_forward  # noqa: E402
from kernels.flops import attention_flops  # noqa: E402

__all__ = ["flash_attention", "flash_attn_forward", "flash_attn_backward", "attention_flops"]
