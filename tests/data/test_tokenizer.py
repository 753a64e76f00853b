"""data/tokenizer.py: byte-level BPE that round-trips any text."""

import pytest

from data import EOT, train_bpe


def test_tokenizer_round_trips_any_text():
    tok = train_bpe([["the cat sat on the mat\n" * 20, "def f(x):\n    return x\n" * 20]], vocab_size=300, min_frequency=2)
    assert 257 <= tok.get_vocab_size() <= 300
    assert tok.token_to_id(EOT) is not None
    for text in ["the cat sat", "  leading spaces\ttabs\n", "unseen: Ωμέγα 漢字 🙂 \ufffd", "\x00\x01 bytes"]:
        ids = tok.encode(text).ids
        assert tok.decode(ids) == text, (text, ids)
    assert len(tok.encode("the cat sat on the mat").ids) < len("the cat sat on the mat")  # merges were learned
    with pytest.raises(ValueError, match="vocab_size=100 is too small"):
        train_bpe([["x"]], vocab_size=100, min_frequency=2)
