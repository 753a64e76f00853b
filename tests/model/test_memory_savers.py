"""Activation checkpointing and the chunked loss change memory, not the function: checkpointing gives
bitwise the same loss and gradients (the backward reruns the very same forward ops, dropout masks
included); the chunked loss the same up to float rounding (its chunk sums are added in another order)."""

import copy

import pytest
import torch
import torch.nn.functional as F

from model import GPT, GPTConfig, get_attention
from model.loss import chunked_cross_entropy
from model.rope import rope_angles


def loss_and_grads(model, idx, targets, seed=1):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)  # dropout masks
    _, loss = model(idx, targets)
    loss.backward()
    # (names without torch.compile's "_orig_mod." prefix)
    return loss.detach(), {n.removeprefix("_orig_mod."): p.grad.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("name, position", [("naive", "learned"), ("sdpa", "rope"),
                                            pytest.param("flash", "rope", marks=pytest.mark.slow)])
def test_checkpointing_gives_bitwise_the_same_loss_and_gradients(name, position):
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=2 if name != "flash" else 1, n_head=2, n_embd=32, vocab_size=64, seq_len=24, dropout=0.1,
                    position=position)
    model = GPT(cfg, get_attention(name))
    idx, targets = torch.randint(0, 64, (2, 2, 24))
    plain = loss_and_grads(model, idx, targets)
    model.set_checkpointing(True)
    assert model.checkpointing
    checkpointed = loss_and_grads(model, idx, targets)
    assert torch.equal(plain[0], checkpointed[0])
    for n, g in plain[1].items():
        assert torch.equal(g, checkpointed[1][n]), f"{n}: max diff {(g - checkpointed[1][n]).abs().max():.2e}"
    if name != "flash":  # (the interpreter is slow, and dropout is the model's, not the attention's)
        other_masks = loss_and_grads(model, idx, targets, seed=2)[0]
        assert not torch.equal(plain[0], other_masks)  # dropout is on: the equality above is not a trivial one


def test_checkpointing_saves_the_block_inputs_only():
    """What autograd keeps for the backward, counted by a saved-tensor hook: with checkpointing,
    per block only its input (and rope's cos/sin) instead of a dozen activations."""
    cfg = GPTConfig(n_layer=3, n_head=2, n_embd=32, vocab_size=64, seq_len=32, position="rope")
    model = GPT(cfg)
    idx = torch.randint(0, 64, (1, 32))
    rope = rope_angles(torch.arange(32), cfg.head_dim, cfg.rope_base)

    def saved_in_blocks(on: bool) -> int:
        model.set_checkpointing(on)
        x = model.wte(idx).detach().requires_grad_()
        count = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: count.append(t.numel()) or t, lambda t: t):
            for block in model.blocks:
                x = block(x, rope)
        return len(count)

    assert saved_in_blocks(True) < saved_in_blocks(False) / 5


def test_chunked_cross_entropy_equals_the_plain_one_within_rounding():
    """Loss and both gradients against float64, by the exactness rule: the chunked error is at most
    2× the plain fp32 error (each element at least one ulp), with chunks that do not divide the
    tokens and ignored targets (-100) in between."""
    torch.manual_seed(0)
    hidden = torch.randn(3, 37, 16, requires_grad=True)
    weight = torch.randn(50, 16, requires_grad=True)
    targets = torch.randint(0, 50, (3, 37))
    targets[1, 5:9] = -100

    def run(fn, dtype):
        h, w = hidden.detach().to(dtype).requires_grad_(), weight.detach().to(dtype).requires_grad_()
        loss = fn(h, w)
        loss.backward()
        return [loss.detach().double(), h.grad.double(), w.grad.double()]

    plain = lambda h, w: F.cross_entropy((h @ w.T).flatten(0, 1), targets.flatten())  # noqa: E731
    ref = run(plain, torch.float64)
    fp32 = run(plain, torch.float32)
    for chunk in (1, 10, 111, 500):
        chunked = run(lambda h, w: chunked_cross_entropy(h, w, targets, chunk), torch.float32)
        for what, c, p, r in zip(("loss", "d hidden", "d weight"), chunked, fp32, ref):
            standard = torch.maximum((p - r).abs(), torch.finfo(torch.float32).eps * r.abs()).max().item()
            err = (c - r).abs().max().item()
            assert err <= 2 * standard, f"chunk={chunk} {what}: {err:.2e} > 2 × {standard:.2e}"


def test_model_with_chunked_loss_returns_no_logits_and_the_same_loss():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, vocab_size=64, seq_len=24))
    idx, targets = torch.randint(0, 64, (2, 2, 24))
    logits, plain = model(idx, targets)
    model.loss_chunk = 7
    none, chunked = model(idx, targets)
    assert logits.shape == (2, 24, 64) and none is None
    torch.testing.assert_close(chunked, plain, rtol=1e-6, atol=0)
    with torch.no_grad():  # evaluation: no checkpoint, same number
        torch.testing.assert_close(model(idx, targets)[1], plain, rtol=1e-6, atol=0)
    with pytest.raises(ValueError, match="loss_chunk must be a positive number of tokens"):
        chunked_cross_entropy(torch.zeros(4, 8), torch.zeros(3, 8), torch.zeros(4, dtype=torch.long), 0)


@pytest.mark.slow
def test_compiled_checkpointed_chunked_model_equals_eager():
    """torch.compile (dynamo traces the block checkpoints as its checkpoint operator; AOTAutograd
    partitions the recompute; the chunked loss stays eager, out of every graph) gives the eager
    model's loss and gradients. The aot_eager backend runs the same traced graphs without
    generating kernels (inductor needs a C++ toolchain and minutes on 2 cores)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, vocab_size=32, seq_len=16, position="rope"))
    idx, targets = torch.randint(0, 32, (2, 2, 16))
    eager = loss_and_grads(model, idx, targets)
    model.set_checkpointing(True)
    model.loss_chunk = 12
    torch._dynamo.reset()
    graphs = []

    def recording_aot_eager(gm, example_inputs):
        graphs.append(gm)
        return torch._dynamo.backends.registry.lookup_backend("aot_eager")(gm, example_inputs)

    compiled = torch.compile(copy.deepcopy(model), backend=recording_aot_eager)
    loss, grads = loss_and_grads(compiled, idx, targets)
    # every traced op, checkpoint bodies (submodules of the graph) included
    traced = {str(node.target) for gm in graphs for sub in gm.modules() if isinstance(sub, torch.fx.GraphModule)
              for node in sub.graph.nodes}
    assert graphs and not any("cross_entropy" in t for t in traced), "the chunked loss must run eagerly"
    torch.testing.assert_close(loss, eager[0], rtol=1e-6, atol=0)
    for n, g in eager[1].items():
        torch.testing.assert_close(grads[n], g, rtol=1e-5, atol=1e-7, msg=lambda m: f"{n}: {m}")
