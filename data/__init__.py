"""Data: corpus -> byte-level BPE tokenizer -> flat token files -> random windows.

    ds = build_dataset(cfg.data, seq_len, cache_dir, seed)
    x, y = ds.sample_batch("train", batch_size, step)
"""

from data.dataset import TokenDataset, build_dataset, token_dtype
from data.tokenizer import EOT, train_bpe

__all__ = ["EOT", "TokenDataset", "build_dataset", "token_dtype", "train_bpe"]
