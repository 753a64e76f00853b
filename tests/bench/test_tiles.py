"""bench/tiles.py (needs kernels.flash_attn.launch): forced configs replace only the fields given,
and our kernels under them compute what the defaults compute."""

import dataclasses

import torch

from bench import tiles
from bench.inputs import random_inputs
from kernels import flash_attention
from kernels.flash_attn import launch

CPU = torch.device("cpu")


def test_config_replaces_only_the_given_fields():
    table = launch.kernel_config("bwd_dq", 16, torch.bfloat16, True)
    assert tiles.config("bwd_dq", 16, torch.bfloat16, True) == table
    forced = tiles.config("bwd_dq", 16, torch.bfloat16, True, BLOCK_N=32, BLOCK_M=None, TMA=not table.TMA)
    assert forced == dataclasses.replace(table, BLOCK_N=32, TMA=not table.TMA)
    assert tiles.block_d(24) == 32 and tiles.block_d(8) == 16


def test_forced_forward_and_kernel_calls_match_the_defaults():
    q, k, v, do = random_inputs(1, 2, 40, 16, torch.float32, CPU, requires_grad=False)
    expected = flash_attention(q, k, v, causal=True)
    forced = tiles.config("fwd", 16, torch.float32, True, BLOCK_M=32, BLOCK_N=16)
    torch.testing.assert_close(tiles.forward_at(forced)(q, k, v, True), expected)

    calls = tiles.kernel_calls(q, k, v, do, True)
    assert set(calls) == set(launch.KERNELS)
    o, lse = launch.forward(q, k, v, True, 16**-0.5)
    dq, dk, dv = launch.backward(do, q, k, v, o, lse, True, 16**-0.5)
    small = {name: tiles.config(name, 16, torch.float32, True, BLOCK_M=16, BLOCK_N=16) for name in launch.KERNELS}
    torch.testing.assert_close(calls["fwd"](small["fwd"]), expected)
    torch.testing.assert_close(calls["bwd_dkdv"](small["bwd_dkdv"]), dk)
    torch.testing.assert_close(calls["bwd_dq"](small["bwd_dq"]), dq)
    for got, want in zip(calls["bwd_fused"](small["bwd_fused"]), (dq, dk, dv)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)  # atomic adds: order may differ
