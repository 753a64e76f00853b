"""model/flops.py: FLOPs per token, MFU, and the counted FLOPs of a step split by model and attention."""

import pytest
import torch

from kernels.flops import attention_flops
from model import GPT, GPTConfig, get_attention
from model.flops import count_step_flops, flops_per_token, measure_matmul_flops, mfu, recompute_flops_per_token

NAMES = ["naive", "sdpa", "flash"]


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
    algorithmic = {  # what causal attention needs, the same for every attention: 4·d·pairs, stored-P 8·d·pairs
        "flops/attn_fwd_algorithmic": cfg.n_layer * batch * cfg.n_head * 4 * pairs * cfg.head_dim,
        "flops/attn_bwd_algorithmic": cfg.n_layer * batch * cfg.n_head * 8 * pairs * cfg.head_dim,
    }
    for name, c in counts.items():
        assert {k: c[k] for k in algorithmic} == algorithmic, name
    # flash executes the visible pairs (its registered formula), and its backward recomputes QKᵀ: 2.5× the forward
    flash = counts["flash"]
    assert flash["flops/attn_fwd_executed"] == flash["flops/attn_fwd_algorithmic"]
    assert flash["flops/attn_bwd_executed"] == 2.5 * flash["flops/attn_fwd_executed"]
    assert flash["flops/attn_recompute"] == flash["flops/attn_bwd_executed"] - flash["flops/attn_bwd_algorithmic"] > 0
    assert 0 < flash["flops/attn_recompute_share"] < 0.1
    # naive multiplies the whole N×N square (mask applied afterwards) and keeps P: no recompute
    naive = counts["naive"]
    assert naive["flops/attn_fwd_executed"] == cfg.n_layer * batch * cfg.n_head * 4 * cfg.seq_len**2 * cfg.head_dim
    assert naive["flops/attn_bwd_executed"] == 2 * naive["flops/attn_fwd_executed"]
    assert naive["flops/attn_recompute"] == 0


@pytest.mark.parametrize("name", ["naive", "flash"])
def test_recompute_flops_formula_equals_what_the_counter_sees(name):
    """Checkpointing and the chunked loss add to the backward exactly recompute_flops_per_token's
    blocks and lm_head terms (dense matmuls: qkv, attention projection, fc, not the MLP's output
    projection; attention: one more forward as the counter counts it), counted on the meta device."""
    cfg = GPTConfig(n_layer=2, n_head=4, n_embd=64, vocab_size=512, seq_len=128, position="rope")
    batch, tokens = 3, 3 * 128
    attend = get_attention(name)
    plain = count_step_flops(cfg, attend, batch)
    saving = count_step_flops(cfg, attend, batch, checkpointing=True, loss_chunk=100)
    extra = recompute_flops_per_token(cfg, name, checkpointing=True, loss_chunk=100)
    assert saving["flops/model_fwd"] == plain["flops/model_fwd"]
    dense_blocks = extra["blocks"] - cfg.n_layer * attention_flops(1, cfg.n_head, 128, 128, cfg.head_dim, True) / 128
    assert saving["flops/model_bwd"] - plain["flops/model_bwd"] == (dense_blocks + extra["lm_head"]) * tokens
    assert saving["flops/attn_bwd_executed"] - plain["flops/attn_bwd_executed"] == plain["flops/attn_fwd_executed"]  # the attention forward, again
    assert recompute_flops_per_token(cfg, name, False, 0)["blocks"] == 0 == recompute_flops_per_token(cfg, name, False, 0)["lm_head"]
    # the attention backward's own recompute: flash rebuilds QKᵀ (2·d·pairs per head), naive kept P
    assert extra["attention_bwd"] * tokens == (plain["flops/attn_recompute"] if name == "flash" else 0)


def test_hfu_over_mfu_at_long_context():
    """GPT-2 medium at 128K tokens with flash, checkpointing and the chunked loss. Attention dominates
    there: per head and pair it costs the model 4 + 8 = 12·d but the hardware 4 + 10 + 4 = 18·d (the
    backward's QKᵀ, the rerun forward), so HFU / MFU approaches 1.5 from below."""
    cfg = GPTConfig(n_layer=24, n_head=16, n_embd=1024, vocab_size=50304, seq_len=131072, position="rope")
    with torch.device("meta"):
        n_params = GPT(cfg).num_params()
    model = flops_per_token(cfg, n_params)
    extra = recompute_flops_per_token(cfg, "flash", True, 4096)
    ratio = (model + sum(extra.values())) / model
    assert 1.4 < ratio < 1.5, ratio
