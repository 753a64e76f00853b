"""bench/ncu_child.py on CPU (needs kernels.flash_attn.launch): the child's flags round-trip from
bench/ncu.py, and it runs warm-up calls then exactly one pass, at the forced tiles when asked."""

import pytest
import torch

from bench import ncu_child
from bench.inputs import Shape
from bench.ncu import child_args
from kernels.flash_attn import launch

CPU = torch.device("cpu")
SHAPE = Shape(1, 1, 64, 16, "float16", True)


def test_flags_round_trip():
    args = ncu_child.parse_args(child_args("flash", SHAPE, CPU, "fwd", block_m=32, block_n=16))
    assert ncu_child.shape_of(args) == SHAPE
    assert (args.impl, args.pass_, args.block_m, args.block_n, args.device) == ("flash", "fwd", 32, 16, "cpu")
    args = ncu_child.parse_args(child_args("naive", Shape(2, 3, 8, 16, "bfloat16", False), CPU))
    assert ncu_child.shape_of(args).causal is False and args.pass_ == "fwdbwd" and args.block_n is None


def test_forced_tiles_only_for_our_forward(capsys):
    with pytest.raises(SystemExit):
        ncu_child.parse_args(child_args("naive", SHAPE, CPU, "fwd", block_n=32))
    assert "flash --pass fwd" in capsys.readouterr().err


def test_runs_warmup_then_one_pass_at_the_forced_tiles(monkeypatch):
    configs = []
    forward = launch.forward

    def spy(q, k, v, causal, scale, config=None):
        configs.append(config)
        return forward(q, k, v, causal, scale, config=config)

    monkeypatch.setattr(launch, "forward", spy)
    ncu_child.main(child_args("flash", SHAPE, CPU, "fwd", block_n=32))
    table = launch.kernel_config("fwd", 16, torch.float16, True)
    assert len(configs) == ncu_child.WARMUP_CALLS + 1
    assert all(c.BLOCK_N == 32 and c.BLOCK_M == table.BLOCK_M and c.num_warps == table.num_warps for c in configs)


def test_forward_backward_pass_of_an_impl(monkeypatch):
    calls = []
    make_impl = ncu_child.make_impl

    def counting(name):
        attn = make_impl(name)
        return lambda q, k, v, causal: calls.append(q.requires_grad) or attn(q, k, v, causal)

    monkeypatch.setattr(ncu_child, "make_impl", counting)
    ncu_child.main(child_args("naive", SHAPE, CPU, "fwdbwd"))
    assert calls == [True] * (ncu_child.WARMUP_CALLS + 1)
