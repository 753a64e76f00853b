"""model/gpt.py: GPT-2 structure, and the same function under every attention."""

import copy
import math

import pytest
import torch

from model import GPT, GPTConfig, get_attention

NAMES = ["naive", "sdpa", "flash"]
TINY = GPTConfig(n_layer=2, n_head=2, n_embd=64, vocab_size=96, seq_len=64)


def forward_backward(model: GPT, idx: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, dict]:
    model.zero_grad(set_to_none=True)
    logits, loss = model(idx, targets)
    loss.backward()
    return logits.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def test_same_weights_same_logits_and_grads_across_attentions():
    """docs/DESIGN.md's exactness rule at model level: against a float64 copy, each attention's error is
    at most 2x (logits) / 3x (each gradient) that of the textbook fp32 model, plus 1e-5."""
    torch.manual_seed(0)
    model = GPT(TINY)
    for block in model.blocks:  # GPT-2's init gives near-uniform attention, which hides mistakes
        torch.nn.init.normal_(block.attn.qkv.weight, std=0.2)  # scores of order 1-10: peaky softmax
    idx = torch.randint(0, TINY.vocab_size, (2, 50))  # 50: not a multiple of any block size
    targets = torch.randint(0, TINY.vocab_size, (2, 50))
    ref64 = copy.deepcopy(model).double()
    ref64.set_attention(get_attention("naive"))
    ref_logits, ref_grads = forward_backward(ref64, idx, targets)

    errors = {}
    for name in NAMES:
        model.set_attention(get_attention(name))
        logits, grads = forward_backward(model, idx, targets)
        errors[name] = {"logits": (logits.double() - ref_logits).abs().max().item()}
        errors[name].update({n: (g.double() - ref_grads[n]).abs().max().item() for n, g in grads.items()})
    standard = errors["naive"]  # plain PyTorch in the input precision
    for name in NAMES:
        for what, err in errors[name].items():
            bound = (2 if what == "logits" else 3) * standard[what] + 1e-5
            assert err <= bound, f"attention={name} {what}: error {err:.2e} > bound {bound:.2e} vs float64"


@pytest.mark.parametrize("name", NAMES)
def test_causal_no_token_sees_the_future(name):
    torch.manual_seed(0)
    model = GPT(TINY, get_attention(name))
    idx = torch.randint(0, TINY.vocab_size, (1, 40))
    changed = idx.clone()
    changed[0, 30:] = (changed[0, 30:] + 1) % TINY.vocab_size
    with torch.no_grad():
        a, b = model(idx)[0], model(changed)[0]
    torch.testing.assert_close(a[:, :30], b[:, :30], rtol=0, atol=0)
    assert not torch.allclose(a[:, 30:], b[:, 30:])


def test_structure_tied_embeddings_and_parameter_count():
    cfg = GPTConfig(n_layer=24, n_head=16, n_embd=1024, vocab_size=50304, seq_len=1024)
    with torch.device("meta"):  # shapes only: no memory, no init cost
        model = GPT(cfg)
    assert model.lm_head.weight is model.wte.weight
    assert cfg.head_dim == 64
    C, L, V = cfg.n_embd, cfg.n_layer, cfg.vocab_size
    per_layer = 12 * C * C + 13 * C  # qkv 3C²+3C, proj C²+C, fc 4C²+4C, proj 4C²+C, two LayerNorms 4C
    assert model.num_params() == L * per_layer + V * C + 2 * C  # + tied embedding + final LayerNorm
    assert model.num_params(non_embedding=False) == model.num_params() + cfg.seq_len * C


def test_initial_loss_is_near_uniform():
    torch.manual_seed(0)
    model = GPT(TINY)
    idx, targets = torch.randint(0, TINY.vocab_size, (2, 4, 64))
    _, loss = model(idx, targets)
    assert abs(loss.item() - math.log(TINY.vocab_size)) < 0.1


def test_longer_than_seq_len_is_refused():
    model = GPT(TINY)
    with pytest.raises(ValueError, match="longer than the model's seq_len=64"):
        model(torch.zeros(1, 65, dtype=torch.long))
