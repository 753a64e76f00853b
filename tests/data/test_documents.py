"""Document ids and positions for data.document_mask / data.reset_positions: from the EOT boundaries
of the real token files, each id run of a batch row is one corpus file."""
from pathlib import Path

import torch
from _corpus import text_cfg, write_corpus

from data import EOT, build_dataset
from data.documents import document_ids, document_positions
from training.batches import document_inputs


def test_ids_count_the_eot_tokens_before_each_position():
    x = torch.tensor([[5, 9, 0, 3, 0, 0, 7, 8], [1, 2, 3, 4, 5, 6, 7, 0]])
    ids = document_ids(x, eot_id=0)  # an EOT closes its own document
    assert ids.tolist() == [[0, 0, 0, 1, 1, 2, 3, 3], [0] * 8]
    assert document_positions(ids).tolist() == [[0, 1, 2, 0, 1, 0, 0, 1], list(range(8))]


def test_batch_document_ids_follow_the_file_boundaries(tmp_path: Path):
    write_corpus(tmp_path / "corpus", files=40, words=12)  # short files: several per window
    ds = build_dataset(text_cfg(tmp_path / "corpus"), seq_len=64, cache_dir=tmp_path / "cache", seed=0)
    originals = {p.read_text(encoding="utf-8") for p in (tmp_path / "corpus").glob("*.txt")}
    x, _ = ds.sample_batch("train", 4, step=0)
    inputs = document_inputs(ds, document_mask=True, reset_positions=True)(x)
    ids, positions = inputs["document_ids"], inputs["positions"]
    whole = 0
    for row, row_ids, row_pos in zip(x, ids, positions):
        for doc in row_ids.unique().tolist():
            where = (row_ids == doc).nonzero().flatten()
            assert torch.equal(where, torch.arange(where[0], where[-1] + 1))  # one run per document
            assert torch.equal(row_pos[where], torch.arange(len(where)))  # positions restart
            text = ds.tokenizer.decode(row[where].tolist(), skip_special_tokens=False)
            if where[0] > 0 and text.endswith(EOT):  # a document wholly inside the window: one file
                assert text.removesuffix(EOT) in originals
                whole += 1
            else:  # cut by the window's edge: part of one file
                assert any(text.removesuffix(EOT) in o for o in originals)
    assert whole > 0
    assert document_inputs(ds, document_mask=False, reset_positions=False)(x) == {}
