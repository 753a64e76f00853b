"""attention.window and document ids: naive, sdpa and flash apply one mask, and a packed document
sees nothing of its neighbours (with reset positions, its logits are those of the document alone)."""
import pytest
import torch

from kernels.reference import attention_mask, attention_reference
from model.attention import get_attention, visible_mask, window_size
from model.gpt import GPT, GPTConfig


@pytest.mark.parametrize("window", [None, 1, 5, 40])
def test_model_mask_is_the_kernel_contracts(window):
    ids = torch.tensor([[0] * 7 + [1] * 20 + [2] * 5, [3] * 32])
    ours = visible_mask(32, 32, True, window, ids, torch.device("cpu"))
    assert torch.equal(ours, attention_mask(32, 32, True, window_size(window), ids))


@pytest.mark.parametrize("name", ["naive", "sdpa", "flash"])
def test_each_attention_matches_the_reference_under_window_and_documents(name):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 40, 16) for _ in range(3))
    ids = torch.tensor([[0] * 13 + [1] * 27, [0] * 2 + [1] * 38])
    attend = get_attention(name, window=6)
    out = attend(q, k, v, causal=True, document_ids=ids)
    ref = attention_reference(q, k, v, causal=True, window_size=(5, 0), document_ids=ids)
    torch.testing.assert_close(out.double(), ref, atol=2e-5, rtol=0)


@pytest.mark.parametrize("window", [0, -3, True])
def test_bad_window_names_the_field(window):
    with pytest.raises(ValueError, match="attention.window must be null or a positive int"):
        get_attention("naive", window=window)


def test_packed_document_sees_nothing_of_its_neighbours():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, vocab_size=32, seq_len=24), get_attention("naive")).eval()
    alone = torch.randint(32, (1, 10))
    packed = torch.cat([torch.randint(32, (1, 6)), alone, torch.randint(32, (1, 8))], 1)
    ids = torch.tensor([[0] * 6 + [1] * 10 + [2] * 8])
    positions = torch.cat([torch.arange(6), torch.arange(10), torch.arange(8)])[None]
    with torch.no_grad():
        want, _ = model(alone)
        got, _ = model(packed, document_ids=ids, positions=positions)
        leaky, _ = model(packed)  # the control: without the mask the neighbours leak in
    torch.testing.assert_close(got[:, 6:16], want, atol=1e-5, rtol=0)
    assert not torch.allclose(leaky[:, 6:16], want, atol=1e-3)
