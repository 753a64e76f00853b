"""GPT-2: pre-LayerNorm blocks, learned or rotary positions, GELU MLP, token embedding tied to the output.

The attention inside each block is whatever `attend` function it is given (model/attention.py),
so naive, sdpa and flash models share weights and can be compared one to one. Two switches trade
compute for memory at long context, neither changing the function computed: activation
checkpointing per block (`set_checkpointing`) and a chunked loss (`loss_chunk`, model/loss.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from model.attention import AttendFn, sdpa_attention
from model.loss import chunked_cross_entropy
from model.rope import Rope, apply_rope, rope_angles

POSITIONS = ("learned", "rope")  # model.position: a learned table (GPT-2) or rotary embeddings (model/rope.py)


@dataclass(frozen=True)
class GPTConfig:
    n_layer: int
    n_head: int
    n_embd: int
    vocab_size: int
    seq_len: int  # longest sequence; sizes the learned position table
    dropout: float = 0.0
    bias: bool = True
    position: str = "learned"  # one of POSITIONS
    rope_base: float = 10000.0  # rotary θ_i = rope_base^(-2i/head_dim); larger reaches further

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

    def forward(self, x: Tensor, rope: Rope | None = None, document_ids: Tensor | None = None) -> Tensor:
        B, N, C = x.shape
        # (B, N, 3C) -> three (B, H, N, D) views; strided, which every attend() accepts.
        q, k, v = self.qkv(x).view(B, N, 3, self.n_head, C // self.n_head).permute(2, 0, 3, 1, 4)
        if rope is not None:  # every attention sees the same rotated q and k
            q, k = apply_rope(q, rope), apply_rope(k, rope)
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
        self.checkpointing = False  # GPT.set_checkpointing

    def forward(self, x: Tensor, rope: Rope | None = None, document_ids: Tensor | None = None) -> Tensor:
        if self.checkpointing and torch.is_grad_enabled():
            # Keep only the inputs; the backward reruns _forward to rebuild the rest. Inside forward,
            # so DDP/FSDP hooks on the block stay outside the recomputed region and torch.compile traces it.
            return checkpoint(self._forward, x, rope, document_ids, use_reentrant=False)
        return self._forward(x, rope, document_ids)

    def _forward(self, x: Tensor, rope: Rope | None, document_ids: Tensor | None) -> Tensor:
        x = x + self.attn(self.ln_1(x), rope, document_ids)  # pre-LN: normalise the branch input, keep the residual raw
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig, attend: AttendFn = sdpa_attention) -> None:
        super().__init__()
        if cfg.position not in POSITIONS:
            raise ValueError(f"model.position={cfg.position!r} is unknown; choose one of {', '.join(POSITIONS)}")
        if cfg.position == "rope" and cfg.head_dim % 2:
            raise ValueError(f"model.position=rope needs an even head_dim (n_embd/n_head = {cfg.head_dim})")
        self.cfg = cfg
        self.loss_chunk = 0  # tokens per cross-entropy chunk; 0 = the whole logits at once (model/loss.py)
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.seq_len, cfg.n_embd) if cfg.position == "learned" else None
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

    def set_checkpointing(self, on: bool) -> None:
        """Activation checkpointing per block: the forward keeps each block's input only and the
        backward reruns the block's forward first (the same function, about 1/3 more FLOPs)."""
        for block in self.blocks:
            block.checkpointing = on

    @property
    def checkpointing(self) -> bool:
        return any(block.checkpointing for block in self.blocks)

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; by default without the position table, which does no matmul.

        The token embedding stays in: tied to lm_head, it is the largest matmul per token.
        """
        n = sum(p.numel() for p in self.parameters())
        return n - self.wpe.weight.numel() if non_embedding and self.wpe is not None else n

    def forward(
        self, idx: Tensor, targets: Tensor | None = None, positions: Tensor | None = None,
        document_ids: Tensor | None = None,
    ) -> tuple[Tensor | None, Tensor | None]:
        """Logits (B, N, vocab) for token ids (B, N); with targets, also the mean cross-entropy.

        `positions`: each token's position in its whole sequence, a LongTensor (N,) or (B, N); by
        default 0..N-1. Context parallelism passes the global positions of this rank's tokens;
        data.reset_positions restarts them at each document. `document_ids` (B, N): every attention
        then stays inside a document (data.document_mask). With targets and `loss_chunk` > 0 the
        logits are never built whole, and None is returned in their place.
        """
        n = idx.shape[1]
        if n > self.cfg.seq_len:
            raise ValueError(f"sequence of {n} tokens is longer than the model's seq_len={self.cfg.seq_len}")
        if positions is None:
            positions = torch.arange(n, device=idx.device)
        elif positions.dim() not in (1, 2) or positions.shape[-1] != n or positions.is_floating_point():
            raise ValueError(f"positions must be integers of shape ({n},) or (batch, {n}); got {positions.dtype} "
                             f"{tuple(positions.shape)}")
        x, rope = self.wte(idx), None  # (B, N, C)
        if self.wpe is not None:
            x = x + self.wpe(positions)  # (N, C) or (B, N, C)
        else:  # float64 weights (a reference model) get float64 rotations
            rope = rope_angles(positions, self.cfg.head_dim, self.cfg.rope_base,
                               torch.promote_types(self.wte.weight.dtype, torch.float32))
        x = self.drop(x)
        for block in self.blocks:
            x = block(x, rope, document_ids)
        x = self.ln_f(x)
        if targets is None:
            return self.lm_head(x), None  # (B, N, V)
        if self.loss_chunk > 0:
            return None, chunked_cross_entropy(x, self.lm_head.weight, targets, self.loss_chunk)
        logits = self.lm_head(x)
        return logits, F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
