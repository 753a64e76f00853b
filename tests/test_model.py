"""model/gpt.py and model/flops.py: GPT-2 structure, equivalence across attentions, FLOP counts."""

import copy
import math

import pytest
import torch

from model import GPT, GPTConfig, get_attention
from model.flops import count_step_flops, flops_per_token, measure_matmul_flops, mfu

NAMES = ["naive", "sdpa", "flash"]
TINY = GPTConfig(n_layer=2, n_head=2, n_embd=64, vocab_size=96, seq_len=64)


def forward_backward(model: GPT, idx: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, dict]:
    model.zero_grad(set_to_none=True)
    logits, loss = model(idx, targets)
    loss.backward()
    return logits.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def test_same_weights_same_logits_and_grads_across_attentions():
    """DESIGN.md's exactness rule at model level: against a float64 copy, each attention's error is
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


def test_flops_per_token_gpt2_medium():
    """6·P + per layer fwd 4·d·pairs·H + bwd 8·d·pairs·H, pairs = N(N+1)/2, H·d = C:
    6·C·(N+1) per token and layer."""
    cfg = GPTConfig(n_layer=24, n_head=16, n_embd=1024, vocab_size=50304, seq_len=1024)
    with torch.device("meta"):
        n_params = GPT(cfg).num_params()
    expected = 6 * n_params + 24 * 6 * 1024 * 1025
    assert flops_per_token(cfg, n_params) == expected
    # A bit under nanoGPT's non-causal 6N + 12·L·C·N (attention there counts the masked half too).
    nanogpt = 6 * n_params + 12 * 24 * 1024 * 1024
    assert 0.9 * nanogpt < expected < nanogpt


def test_mfu_and_measured_peak():
    assert mfu(tokens_per_s=1000.0, flops_per_tok=2e9, peak_flops=4e12) == pytest.approx(0.5)
    peak = measure_matmul_flops(torch.device("cpu"), torch.float32, size=256, reps=3)
    assert 1e8 < peak < 1e14  # a CPU core does between 0.1 GFLOP/s and 100 TFLOP/s


def test_step_flops_split_model_attention_and_show_the_recompute():
    cfg = GPTConfig(n_layer=2, n_head=4, n_embd=64, vocab_size=512, seq_len=128)
    batch, tokens = 3, 3 * 128
    matmul_params = cfg.n_layer * 12 * cfg.n_embd**2 + cfg.vocab_size * cfg.n_embd  # qkv+proj+mlp, tied lm_head
    pairs = cfg.seq_len * (cfg.seq_len + 1) // 2
    counts = {name: count_step_flops(cfg, get_attention(name), batch) for name in NAMES}
    for name, c in counts.items():
        assert c["flops/model_fwd"] == 2 * matmul_params * tokens, name
        assert c["flops/model_bwd"] == 2 * c["flops/model_fwd"], name
    flash = counts["flash"]
    # counted (the op's registered formula) and analytic agree, and the backward is 2.5× the forward
    assert flash["flops/attn_fwd"] == flash["flops/attn_fwd_analytic"] == cfg.n_layer * batch * cfg.n_head * 4 * pairs * cfg.head_dim
    assert flash["flops/attn_bwd"] == flash["flops/attn_bwd_analytic"] == 2.5 * flash["flops/attn_fwd"]
    assert flash["flops/attn_recompute"] == flash["flops/attn_bwd"] - flash["flops/attn_bwd_stored_p_analytic"]
    assert 0 < flash["flops/attn_recompute_share"] < 0.1
    # naive multiplies the whole N×N square (mask applied afterwards) and keeps P: no recompute
    naive = counts["naive"]
    assert naive["flops/attn_fwd"] == cfg.n_layer * batch * cfg.n_head * 4 * cfg.seq_len**2 * cfg.head_dim
    assert naive["flops/attn_bwd"] == 2 * naive["flops/attn_fwd"]
    assert naive["flops/attn_recompute"] == 0
