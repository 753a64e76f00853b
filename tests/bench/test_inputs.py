"""bench/inputs.py: fresh random inputs, the timed calls, and a shape's FLOPs."""

import pytest
import torch

from bench.inputs import Shape, random_inputs, step_fns

CPU = torch.device("cpu")


def test_random_inputs_fresh_nonzero_and_differentiable():
    q, k, v, do = random_inputs(2, 3, 5, 4, torch.bfloat16, CPU)
    assert q.shape == (2, 3, 5, 4) and q.dtype is torch.bfloat16
    assert q.requires_grad and k.requires_grad and v.requires_grad and not do.requires_grad
    assert all(t.count_nonzero() > 0.9 * t.numel() for t in (q, k, v, do))
    assert not torch.equal(q, k)
    assert not torch.equal(q, random_inputs(2, 3, 5, 4, torch.bfloat16, CPU, seed=1)[0])


def test_step_fns_do_forward_and_backward_without_accumulating():
    q, k, v, do = random_inputs(1, 1, 4, 8, torch.float32, CPU)
    calls = []

    def attn(q, k, v, causal):
        calls.append(causal)
        return (q * k * v).sum(-1, keepdim=True).expand_as(q)

    forward, forward_backward = step_fns(attn, q, k, v, do, True)
    assert forward().shape == q.shape
    forward_backward()
    forward_backward()
    assert calls == [True, True, True] and q.grad is None


def test_shape_flops_and_inputs():
    shape = Shape(batch=2, heads=3, seqlen=8, head_dim=16, dtype="float16", causal=True)
    assert shape.elem == 2
    assert shape.flops("fwd", causal=False) == 4 * 2 * 3 * 8 * 8 * 16
    assert shape.flops("fwd") == pytest.approx(4 * 2 * 3 * 16 * 8 * 9 / 2)  # visible pairs N(N+1)/2
    q, *_ = shape.inputs(CPU, requires_grad=False)
    assert q.shape == (2, 3, 8, 16) and q.dtype is torch.float16 and not q.requires_grad
