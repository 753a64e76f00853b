"""The worked examples of the online softmax, checked by hand against kernels/reference.py."""
import math

import pytest
import torch

from kernels.reference import attention_backward_reference, attention_reference, online_softmax_attention

f64 = dict(dtype=torch.float64)


def test_softmax_weights_of_the_four_scores():
    weights = torch.softmax(torch.tensor([1.0, 3.0, 2.0, 4.0], **f64), 0)
    assert weights.tolist() == pytest.approx([0.032, 0.237, 0.087, 0.644], abs=5e-4)


def test_two_blocks_running_max_sum_and_rescale():
    _, _, trace = online_softmax_attention(torch.tensor([1.0, 3.0, 2.0, 4.0], **f64), torch.ones(4, **f64), block_size=2)
    first, second = trace
    assert first.m.item() == 3.0
    assert first.l.item() == pytest.approx(1.135, abs=5e-4)  # e^{1-3} + e^{3-3}
    assert second.alpha.item() == pytest.approx(math.exp(-1), abs=1e-12)  # max rises 3 -> 4
    assert second.l.item() == pytest.approx(1.553, abs=5e-4)  # 1.135·e^{-1} + e^{2-4} + e^{4-4}


def test_eight_scores_in_blocks_of_two():
    scores = torch.tensor([1.0, 3.0, 2.0, 4.0, 1.0, 0.0, 5.0, 2.0], **f64)
    values = torch.tensor([1.0, 4.0, 2.0, 5.0, 3.0, 0.0, 6.0, 2.0], **f64)
    out, lse, _ = online_softmax_attention(scores, values, block_size=2)
    assert out.item() == pytest.approx(5.257, abs=5e-4)
    assert out.item() == pytest.approx((torch.softmax(scores, 0) @ values).item(), rel=1e-12)
    assert lse.item() == pytest.approx(torch.logsumexp(scores, 0).item(), rel=1e-12)


def test_blocks_must_be_rescaled_not_averaged():
    scores = torch.tensor([0.0, 0.0, math.log(3), math.log(3)], **f64)
    values = torch.tensor([0.0, 0.0, 1.0, 1.0], **f64)
    out, _, _ = online_softmax_attention(scores, values, block_size=2)
    assert out.item() == pytest.approx(0.75, abs=1e-12)
    # the tempting mistake: each block's softmax average, then the mean of the two blocks
    per_block = [torch.softmax(scores[i:i + 2], 0) @ values[i:i + 2] for i in (0, 2)]
    assert (sum(per_block) / 2).item() == pytest.approx(0.5)


@pytest.mark.parametrize("block_size", [1, 3, 16, 64])
def test_online_softmax_matches_full_softmax_on_random_rows(block_size):
    scores = torch.randn(5, 37, **f64) * 4
    values = torch.randn(37, 8, **f64)
    out, lse, _ = online_softmax_attention(scores, values, block_size)
    torch.testing.assert_close(out, torch.softmax(scores, -1) @ values, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1), rtol=1e-12, atol=1e-12)


def test_reference_causal_bottom_right_and_empty_rows():
    q = torch.randn(1, 2, 5, 4, **f64)
    k = torch.randn(1, 1, 3, 4, **f64)
    v = torch.randn(1, 1, 3, 4, **f64)
    out = attention_reference(q, k, v, causal=True)
    # query i sees keys j <= i + 3 - 5: rows 0 and 1 see nothing, row 2 sees key 0 only
    assert torch.equal(out[:, :, :2], torch.zeros_like(out[:, :, :2]))
    torch.testing.assert_close(out[:, :, 2], v[:, :, 0].expand(1, 2, 4))
    assert not out.isnan().any()


@pytest.mark.parametrize("causal", [False, True])
def test_backward_formulas_equal_autograd_in_float64(causal):
    # delta = rowsum(dO ∘ O) and dS = P ∘ (dP − delta) are the softmax gradient, GQA and no-key rows included
    q = torch.randn(2, 4, 9, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, 6, 8, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 2, 6, 8, dtype=torch.float64, requires_grad=True)
    do = torch.randn(2, 4, 9, 8, dtype=torch.float64)
    attention_reference(q, k, v, causal).backward(do)
    for got, want in zip(attention_backward_reference(q.detach(), k.detach(), v.detach(), do, causal), (q.grad, k.grad, v.grad)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
