"""GPT-2: pre-LayerNorm blocks, learned positions, GELU MLP, token embedding tied to the output.

The attention inside each block is whatever `attend` function it is given (model/attention.py),
so naive, sdpa and flash models share weights and can be compared one to one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from model.attention import AttendFn, sdpa_attention


@dataclass(frozen=True)
class GPTConfig:
    n_layer: int
    n_head: int
    n_embd: int
    vocab_size: int
    seq_len: int  # longest sequence; sizes the position table
    dropout: float = 0.0
    bias: bool = True

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig, attend: AttendFn) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)
        self.attend = attend

    def forward(self, x: Tensor, document_ids: Tensor | None = None) -> Tensor:
        B, N, C = x.shape
        # (B, N, 3C) -> three (B, H, N, D) views; strided, which every attend() accepts.
        q, k, v = self.qkv(x).view(B, N, 3, self.n_head, C // self.n_head).permute(2, 0, 3, 1, 4)
        # document ids only when there are any: context parallelism's ring attends take (q, k, v, causal)
        extra = {} if document_ids is None else {"document_ids": document_ids}
        o = self.attend(q, k, v, causal=True, **extra)  # (B, H, N, D)
        return self.dropout(self.proj(o.transpose(1, 2).reshape(B, N, C)))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x), approximate="tanh")))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig, attend: AttendFn) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg, attend)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: Tensor, document_ids: Tensor | None = None) -> Tensor:
        x = x + self.attn(self.ln_1(x), document_ids)  # pre-LN: normalise the branch input, keep the residual raw
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig, attend: AttendFn = sdpa_attention) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.seq_len, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, attend) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied: one matrix embeds and un-embeds
        self.apply(self._init_weights)
        # GPT-2: scale residual-branch outputs by 1/sqrt(2·n_layer) so the residual stream's
        # variance does not grow with depth.
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def set_attention(self, attend: AttendFn) -> None:
        """Swap the attention implementation in every block; weights are untouched."""
        for block in self.blocks:
            block.attn.attend = attend

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; by default without the position table, which does no matmul.

        The token embedding stays in: tied to lm_head, it is the largest matmul per token.
        """
        n = sum(p.numel() for p in self.parameters())
        return n - self.wpe.weight.numel() if non_embedding else n

    def forward(
        self, idx: Tensor, targets: Tensor | None = None, positions: Tensor | None = None,
        document_ids: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Logits (B, N, vocab) for token ids (B, N); with targets, also the mean cross-entropy.

        `positions`: each token's position in its whole sequence, a LongTensor (N,) or (B, N); by
        default 0..N-1. Context parallelism passes the global positions of this rank's tokens;
        data.reset_positions restarts them at each document. `document_ids` (B, N): every attention
        then stays inside a document (data.document_mask).
        """
        n = idx.shape[1]
        if n > self.cfg.seq_len:
            raise ValueError(f"sequence of {n} tokens is longer than the model's seq_len={self.cfg.seq_len}")
        pos = torch.arange(n, device=idx.device) if positions is None else positions
        x = self.drop(self.wte(idx) + self.wpe(pos))  # (B, N, C)
        for block in self.blocks:
            x = block(x, document_ids)
        logits = self.lm_head(self.ln_f(x))  # (B, N, V)
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        return logits, loss
