"""Masked attention rows: document masks and causal sliding windows, ours against FlexAttention
(the block-sparse peer, with the equivalent block mask) and SDPA (a dense boolean attn_mask).

Masks (all causal, as the trainer uses them):
    causal        the full causal mask: the baseline of each row's speed-up
    docs_corpus   document ids of real training windows: the stdlib corpus's files as the trainer
                  packs them (data.document_mask: ids from the <|endoftext|> boundaries)
    docs_8        8 equal documents per row
    window_W      a causal sliding window of W tokens (attention.window=W: itself and W − 1 back)
Implementations: flash (ours, called eagerly, as the dense sweep calls every impl), flash_compiled
(ours inside torch.compile, as train.py runs it and as Flex runs here: our ops stay opaque to the
compiler, so compiling removes only the Python around them, the input checks and autograd's
custom-op layer, whose host time the eager rows pay at short sequences), flex, sdpa.
TFLOP/s count the visible pairs only (kernels.flops); speedup_vs_causal is the impl's own causal
fwd+bwd time over this mask's. max_abs_diff: the output's largest difference from ours (flash),
a check that the peers compute the same mask.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor

from bench.failures import run_guarded
from bench.impls import allow_recompiles, compiled_flex
from bench.inputs import random_inputs
from bench.results import rounded
from bench.timing import bench_ms, release_memory
from kernels.flops import attention_flops
from model.attention import get_attention, window_size

MASK_IMPLS = ("flash", "flash_compiled", "flex", "sdpa")
DEFAULT_MASKS = ("causal", "docs_corpus", "docs_8", "window_1024", "window_4096")
MASK_ROW_KEYS = ("impl", "mask", "dtype", "head_dim", "seqlen", "batch", "heads", "visible_fraction", "fwd_ms", "fwdbwd_ms",
                 "fwd_tflops", "fwdbwd_tflops", "speedup_vs_causal", "max_abs_diff", "status")
Masked = Callable[[Tensor, Tensor, Tensor], Tensor]


@dataclasses.dataclass(frozen=True)
class Mask:
    name: str
    window: int | None  # attention.window
    document_ids: Tensor | None  # (batch, seqlen)


def corpus_document_ids(batch: int, seqlen: int, cache_dir: Path, max_files: int | None) -> Tensor:
    """Document ids of `batch` training windows of the stdlib corpus, as the trainer derives them."""
    from omegaconf import OmegaConf

    from data import build_dataset
    from data.documents import document_ids
    from data.tokenizer import EOT

    cfg = OmegaConf.load(Path(__file__).resolve().parents[1] / "configs" / "data" / "stdlib.yaml")
    cfg.pop("defaults")
    cfg.max_files = max_files
    ds = build_dataset(cfg, seqlen, cache_dir, seed=0)
    x, _ = ds.sample_batch("train", batch, step=0)
    return document_ids(x, ds.tokenizer.token_to_id(EOT))


def make_mask(name: str, batch: int, seqlen: int, device: torch.device, corpus: Callable[[int, int], Tensor]) -> Mask:
    if name == "causal":
        return Mask(name, None, None)
    if name == "docs_corpus":
        return Mask(name, None, corpus(batch, seqlen).to(device))
    if name.startswith("docs_"):
        n = int(name.removeprefix("docs_"))
        return Mask(name, None, (torch.arange(seqlen, device=device) * n // seqlen).expand(batch, seqlen).contiguous())
    if name.startswith("window_"):
        return Mask(name, int(name.removeprefix("window_")), None)
    raise ValueError(f"unknown mask {name!r}: causal, docs_corpus, docs_<n> or window_<W>")


def masked_impl(impl: str, mask: Mask, seqlen: int, device: torch.device) -> Masked:
    """q, k, v -> o under `mask` (causal) for one implementation."""
    if impl in ("flash", "flash_compiled", "sdpa"):
        attend = get_attention(impl.removesuffix("_compiled"), window=mask.window)

        def attn(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            return attend(q, k, v, True, document_ids=mask.document_ids)

        if impl == "flash_compiled":
            allow_recompiles()
            # inductor on CUDA, as in training; on the CPU aot_eager (the same graphs, no C++ toolchain)
            return torch.compile(attn, dynamic=False, backend="inductor" if device.type == "cuda" else "aot_eager")
        return attn
    if impl != "flex":
        raise ValueError(f"impl must be one of {MASK_IMPLS}, got {impl!r}")
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    ids, window = mask.document_ids, mask.window

    def mask_mod(b, h, q_idx, kv_idx):
        keep = q_idx >= kv_idx
        if window is not None:
            keep = keep & (q_idx - kv_idx < window)
        if ids is not None:
            keep = keep & (ids[b, q_idx] == ids[b, kv_idx])
        return keep

    batch = ids.shape[0] if ids is not None else None
    block_mask = create_block_mask(mask_mod, batch, None, seqlen, seqlen, device=device)  # built once, outside the timing
    # compiled on CUDA (how FlexAttention is meant to run); eager on CPU, where compiling needs a toolchain
    flex = compiled_flex() if device.type == "cuda" else flex_attention
    return lambda q, k, v: flex(q, k, v, block_mask=block_mask)


def mask_rows(impls: list[str], masks: list[str], dtype: torch.dtype, head_dim: int, seqlen: int, batch: int, heads: int,
              device: torch.device, corpus: Callable[[int, int], Tensor], warmup_ms: float, rep_ms: float,
              timer: str = "events") -> list[dict[str, Any]]:
    """One row per (impl, mask) at one shape; causal first, so every row gets its speed-up (timer: bench.timing.TIMERS)."""
    rows, reference, causal_ms = [], {}, {}
    q, k, v, do = random_inputs(batch, heads, seqlen, head_dim, dtype, device)
    for mask_name in (["causal"] if "causal" not in masks else []) + list(masks):
        mask = make_mask(mask_name, batch, seqlen, device, corpus)
        fwd_flops = attention_flops(batch, heads, seqlen, seqlen, head_dim, True, "fwd", window_size(mask.window), mask.document_ids)
        bwd_flops = attention_flops(batch, heads, seqlen, seqlen, head_dim, True, "bwd", window_size(mask.window), mask.document_ids)
        dense = 4 * batch * heads * seqlen * seqlen * head_dim
        for impl in sorted(impls, key=lambda name: name != "flash"):  # ours first: the others are compared to it
            row: dict[str, Any] = dict(impl=impl, mask=mask_name, dtype=str(dtype).removeprefix("torch."), head_dim=head_dim,
                                       seqlen=seqlen, batch=batch, heads=heads, visible_fraction=fwd_flops / dense)

            def measure() -> None:
                attn = masked_impl(impl, mask, seqlen, device)
                with torch.no_grad():  # the check runs even where a backward cannot (flex on CPU)
                    out = attn(q.detach(), k.detach(), v.detach())
                if impl == "flash":
                    reference[mask_name] = out.detach()
                elif mask_name in reference:
                    row["max_abs_diff"] = (out.float() - reference[mask_name].float()).abs().max().item()
                row["fwd_ms"] = bench_ms(lambda: attn(q, k, v), device, warmup_ms, rep_ms, timer)
                row["fwdbwd_ms"] = bench_ms(lambda: torch.autograd.grad(attn(q, k, v), (q, k, v), do), device, warmup_ms, rep_ms,
                                            timer)

            _, row["status"] = run_guarded(measure, device, f"{impl} {mask_name} N={seqlen}")
            release_memory(device)
            if mask_name == "causal" and row.get("fwdbwd_ms"):
                causal_ms[impl] = row["fwdbwd_ms"]
            if row.get("fwdbwd_ms") and impl in causal_ms:
                row["speedup_vs_causal"] = causal_ms[impl] / row["fwdbwd_ms"]
            row["fwd_tflops"] = fwd_flops / (row["fwd_ms"] * 1e-3) / 1e12 if row.get("fwd_ms") else None
            row["fwdbwd_tflops"] = (fwd_flops + bwd_flops) / (row["fwdbwd_ms"] * 1e-3) / 1e12 if row.get("fwdbwd_ms") else None
            if mask_name in masks:
                rows.append({key: rounded(row.get(key)) if isinstance(row.get(key), float) else row.get(key) for key in MASK_ROW_KEYS})
    return rows
