"""model/rope.py and GPT's `positions`: rotary embeddings against a float64 reference, the relative
position property, and the positions contract (global positions, (N,) or (B, N), for both kinds)."""

import math

import pytest
import torch

from model import GPT, GPTConfig, get_attention
from model.rope import apply_rope, rope_angles

D, BASE = 32, 10000.0


def reference_rope(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """Rotation as complex multiplication, all in float64: (x1 + i·x2)·e^{i·p·θ_j}, θ_j = base^(-2j/D)."""
    d = x.shape[-1]
    theta = torch.tensor([base ** (-2 * j / d) for j in range(d // 2)], dtype=torch.float64)
    turn = torch.polar(torch.ones(len(positions), d // 2, dtype=torch.float64), positions.double()[:, None] * theta)
    x = x.double()
    z = torch.complex(x[..., : d // 2], x[..., d // 2 :]) * turn
    return torch.cat((z.real, z.imag), dim=-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_matches_float64_at_long_positions(dtype):
    """Exactness rule: error vs float64 at most 2× that of the textbook rotation in the input dtype (angles
    in float32, as most implementations form them), counting each element as at least one ulp of it.
    At positions ~1.3e5 the textbook float32 angle is off by up to 0.008 rad; ours is formed in float64."""
    torch.manual_seed(0)
    positions = torch.cat([torch.arange(0, 64), torch.randint(0, 2**17, (64,))])
    x = torch.randn(2, 3, len(positions), D).to(dtype)
    ref = reference_rope(x, positions, BASE)
    ours = apply_rope(x, rope_angles(positions, D, BASE)).double()

    theta = BASE ** (-torch.arange(0, D, 2, dtype=torch.float32) / D)
    angles = positions.float()[:, None] * theta  # the textbook: float32 angles, rotation in the input dtype
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    x1, x2 = x.chunk(2, dim=-1)
    textbook = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).double()
    ulp = torch.finfo(dtype).eps * ref.abs()
    standard = torch.maximum((textbook - ref).abs(), ulp).max().item()
    err = (ours - ref).abs().max().item()
    assert err <= 2 * standard, f"{dtype}: rope error {err:.2e} > 2 × standard {standard:.2e}"
    if dtype == torch.float32:  # float32 output: a few ulp of |x| where the textbook's angles are far off
        assert err <= 4 * torch.finfo(dtype).eps * x.abs().max().item() < standard / 100, (err, standard)


def test_scores_depend_on_the_position_difference_only():
    torch.manual_seed(0)
    q, k = torch.randn(2, 1, 1, 48, D, dtype=torch.float64)
    pos = torch.arange(48)
    scores = [apply_rope(q, rope_angles(pos + s, D, BASE, torch.float64))
              @ apply_rope(k, rope_angles(pos + s, D, BASE, torch.float64)).transpose(-2, -1) for s in (0, 100_003)]
    torch.testing.assert_close(scores[0], scores[1], rtol=0, atol=1e-9)
    plain = q @ k.transpose(-2, -1)
    assert not torch.allclose(scores[0], plain)  # the rotation did something
    assert torch.allclose(scores[0].diagonal(dim1=-2, dim2=-1), plain.diagonal(dim1=-2, dim2=-1))  # p - p' = 0: no turn


def test_odd_head_dim_is_refused():
    with pytest.raises(ValueError, match="head_dim=5 must be even"):
        rope_angles(torch.arange(4), 5, BASE)
    with pytest.raises(ValueError, match="model.position=rope needs an even head_dim"):
        GPT(GPTConfig(1, 2, 10, 32, 8, position="rope"))
    with pytest.raises(ValueError, match="model.position='abc' is unknown; choose one of learned, rope"):
        GPT(GPTConfig(1, 2, 16, 32, 8, position="abc"))


@pytest.mark.parametrize("position", ["learned", "rope"])
def test_positions_are_global_and_per_row(position):
    """The context-parallel contract: positions (N,) or (B, N), default arange(N); a row given its own
    positions computes what that row alone with those positions computes."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(1, 2, 32, 64, 64, position=position))
    idx = torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        default = model(idx)[0]
        torch.testing.assert_close(model(idx, positions=torch.arange(16))[0], default, rtol=0, atol=0)
        offsets = torch.stack([torch.arange(16) + 40, torch.arange(16) + 7])  # (B, N): each row its own
        batched = model(idx, positions=offsets)[0]
        for row in range(2):
            alone = model(idx[row : row + 1], positions=offsets[row])[0]
            torch.testing.assert_close(batched[row : row + 1], alone, rtol=1e-6, atol=1e-6)
        shifted = model(idx, positions=torch.arange(16) + 40)[0]
        first = model(idx[:, :1], positions=torch.tensor([40]))[0]  # causal: token 0 sees only itself
    torch.testing.assert_close(shifted[:, :1], first, rtol=1e-6, atol=1e-6)
    if position == "rope":  # relative: the same tokens shifted as a whole score alike
        torch.testing.assert_close(shifted, default, rtol=1e-5, atol=1e-5)
        assert model.wpe is None and model.num_params() == model.num_params(non_embedding=False)
    else:  # learned: other rows of the table
        assert not torch.allclose(shifted, default, atol=1e-3)


def test_bad_positions_are_refused():
    model = GPT(GPTConfig(1, 2, 32, 64, 64, position="rope"))
    idx = torch.zeros(2, 16, dtype=torch.long)
    for bad in (torch.arange(15), torch.arange(16.0), torch.zeros(2, 2, 16, dtype=torch.long)):
        with pytest.raises(ValueError, match=r"positions must be integers of shape \(16,\) or \(batch, 16\)"):
            model(idx, positions=bad)


@pytest.mark.parametrize("name", ["naive", "sdpa", pytest.param("flash", marks=pytest.mark.slow)])
def test_rope_model_matches_its_float64_copy(name):
    """The whole rope model under each attention, by the exactness rule at model level: logits and every
    gradient within 2× / 3× the error of the plain fp32 (naive) model against a float64 copy."""
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=32, vocab_size=64, seq_len=40, position="rope", rope_base=500.0)
    model = GPT(cfg, get_attention("naive"))
    torch.nn.init.normal_(model.blocks[0].attn.qkv.weight, std=0.2)  # peaky attention: position matters
    idx, targets = torch.randint(0, 64, (2, 2, 40))

    def run(m):
        m.zero_grad(set_to_none=True)
        logits, loss = m(idx, targets)
        loss.backward()
        return {"logits": logits.detach().double(), **{n: p.grad.double() for n, p in m.named_parameters()}}

    ref64 = GPT(cfg, get_attention("naive")).double()
    ref64.load_state_dict(model.state_dict())
    ref = run(ref64)
    standard = {k: (v - ref[k]).abs().max().item() for k, v in run(model).items()}  # plain PyTorch (naive) in fp32
    model.set_attention(get_attention(name))
    for what, value in run(model).items():
        err = (value - ref[what]).abs().max().item()
        bound = (2 if what == "logits" else 3) * standard[what] + 1e-5
        assert err <= bound and math.isfinite(err), f"attention={name} {what}: {err:.2e} > {bound:.2e}"


@pytest.mark.parametrize("name", ["naive", "sdpa", "flash"])
def test_rope_model_trains_under_each_attention(name):
    """Six AdamW steps on one batch of a learnable pattern (token t mostly followed by succ[t]): the
    loss falls at every step, from near log(48) = 3.9 to more than 1 below it, under each attention."""
    from conftest import PatternDataset

    torch.manual_seed(0)
    x, y = PatternDataset(seq_len=16).sample_batch("train", 2, 0)
    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=32, vocab_size=48, seq_len=16, position="rope"), get_attention(name))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(6):
        loss = model(x, y)[1]
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] > 3.5 and losses[-1] < losses[0] - 1.0, losses
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
