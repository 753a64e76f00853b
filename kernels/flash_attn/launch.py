"""Host side of the kernels: launch configs (the tuned table), the TMA rules, and the launchers.

Every launcher takes an optional `config` (None: the table's choice), so a caller that studies
another config (scripts/tune_flash.py, the block-size study, the tests) passes one explicitly;
nothing global changes.
"""
from __future__ import annotations

import dataclasses
import functools
import os

import torch
import triton

from kernels.flash_attn import fast_launch
from kernels.flash_attn.backward import bwd_dq_kernel, bwd_kv_kernel, bwd_preprocess_kernel
from kernels.flash_attn.forward import fwd_kernel
from kernels.flash_attn.masks import KernelMask, resolve
from kernels.flash_attn.tiles import LOG2E

# forward, deterministic backward (dK/dV pass, dQ pass) and the single-pass atomic-dQ backward
# (the Hopper single-pass kernel, backward_hopper.py, has its own config: HopperConfig)
KERNELS = ("fwd", "bwd_dkdv", "bwd_dq", "bwd_fused")


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """Tile sizes and launch knobs of one kernel (BLOCK_M query rows × BLOCK_N keys).

    REVERSE: program i takes block (number of blocks − 1 − i). The GPU starts programs roughly in
    index order, so this decides which blocks run in the last, partly idle wave; under the causal
    mask the longest should start first (the last query blocks, the first key blocks).
    TMA: the inner loop's streamed tiles come through tensor descriptors (Hopper's copy engine)
    instead of masked pointer loads; used only where the tensors allow it (tma_ok).
    maxnreg: a cap on registers per thread (ptxas spills above it), None: the compiler's choice.
    Registers decide how many programs share an SM: at 8 warps, 128 a thread fit two, 129 one."""

    BLOCK_M: int
    BLOCK_N: int
    num_warps: int = 4
    num_stages: int = 2
    REVERSE: bool = False
    TMA: bool = False
    TMA_DQ: bool = False  # bwd_fused only: dQ shares added by TMA bulk reduce-add (Hopper), not per-element atomics
    maxnreg: int | None = None

    def launch_kwargs(self, *tensors: torch.Tensor) -> dict:
        """Kernel keyword arguments; TMA falls back to pointer loads when one of `tensors` (the
        ones the kernel streams through descriptors) has a layout the copy engine can't take."""
        tma = self.TMA and tma_ok(*tensors)
        if tma:
            _ensure_allocator()
        kwargs = dict(BLOCK_M=self.BLOCK_M, BLOCK_N=self.BLOCK_N, REVERSE=self.REVERSE, TMA=tma,
                      num_warps=self.num_warps, num_stages=self.num_stages)
        if self.maxnreg is not None:
            kwargs["maxnreg"] = self.maxnreg
        return kwargs


# ----------------------------------------------------------------------------------------------
# The launch table: H200 measurements (docs/perf-notes.md, "Launch table: where each default
# came from"). Keyed by (kernel, padded head dim up to 64 / 128 / 256, dtype class). REVERSE here
# means "reverse the program order under the causal mask"; kernel_config applies it.
# ----------------------------------------------------------------------------------------------

_FP32_OR_D256 = KernelConfig(32, 32, num_warps=8, num_stages=2)  # backward: fit shared memory and registers

LAUNCH_TABLE: dict[tuple[str, str, str], KernelConfig] = {
    ("fwd", "d64", "16bit"): KernelConfig(128, 64, num_warps=8, num_stages=3, REVERSE=True),
    ("fwd", "d128", "16bit"): KernelConfig(128, 128, num_warps=8, num_stages=3, REVERSE=True),  # 128×128 beat 128×64
    ("fwd", "d256", "16bit"): KernelConfig(64, 32, num_warps=8, num_stages=2, REVERSE=True),  # wider tiles: fit shared memory
    ("fwd", "d64", "fp32"): KernelConfig(64, 32, num_warps=4, num_stages=2, REVERSE=True),
    ("fwd", "d128", "fp32"): KernelConfig(64, 32, num_warps=8, num_stages=2, REVERSE=True),
    ("fwd", "d256", "fp32"): KernelConfig(64, 32, num_warps=8, num_stages=2, REVERSE=True),
    # bwd_dkdv: programs own BLOCK_N keys (dK, dV accumulators) and stream BLOCK_M queries
    ("bwd_dkdv", "d64", "16bit"): KernelConfig(32, 128, num_warps=4, num_stages=3),
    ("bwd_dkdv", "d128", "16bit"): KernelConfig(64, 128, num_warps=8, num_stages=3, TMA=True),  # two warp groups, TMA loads
    ("bwd_dkdv", "d256", "16bit"): _FP32_OR_D256,
    ("bwd_dkdv", "d64", "fp32"): _FP32_OR_D256,
    ("bwd_dkdv", "d128", "fp32"): _FP32_OR_D256,
    ("bwd_dkdv", "d256", "fp32"): _FP32_OR_D256,
    # bwd_dq: programs own BLOCK_M queries and stream BLOCK_N keys (TMA loads of K and V measured faster)
    ("bwd_dq", "d64", "16bit"): KernelConfig(128, 64, num_warps=8, num_stages=3, TMA=True),  # REVERSE measured slower at d=64
    ("bwd_dq", "d128", "16bit"): KernelConfig(128, 64, num_warps=8, num_stages=3, REVERSE=True, TMA=True),
    ("bwd_dq", "d256", "16bit"): dataclasses.replace(_FP32_OR_D256, REVERSE=True),
    ("bwd_dq", "d64", "fp32"): _FP32_OR_D256,
    ("bwd_dq", "d128", "fp32"): dataclasses.replace(_FP32_OR_D256, REVERSE=True),
    ("bwd_dq", "d256", "fp32"): dataclasses.replace(_FP32_OR_D256, REVERSE=True),
    # bwd_fused: as bwd_dkdv, plus a (BLOCK_M, d) dQ tile added atomically per step
    ("bwd_fused", "d64", "16bit"): KernelConfig(32, 128, num_warps=4, num_stages=3, TMA_DQ=True),
    ("bwd_fused", "d128", "16bit"): KernelConfig(64, 128, num_warps=8, num_stages=3, TMA_DQ=True),
    ("bwd_fused", "d256", "16bit"): _FP32_OR_D256,
    ("bwd_fused", "d64", "fp32"): _FP32_OR_D256,
    ("bwd_fused", "d128", "fp32"): _FP32_OR_D256,
    ("bwd_fused", "d256", "fp32"): _FP32_OR_D256,
}


# Read once: kernels/__init__ sets TRITON_INTERPRET before Triton is imported, and Triton reads it
# then too (a later change would not switch Triton over). Reading os.environ per launch cost ~10 µs.
_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1 at import)."""
    return _INTERPRET


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)  # triton.cdiv is a jit function: calling it from Python costs ~20 µs


def kernel_config(kernel: str, block_d: int, dtype: torch.dtype, causal: bool, documents: bool = False) -> KernelConfig:
    """The table's launch config for one kernel (one of KERNELS), from the padded head dim and dtype.

    One table for every caller (tests, training, benchmarks). The interpreter gets 64×64 blocks,
    because its cost grows with the number of programs × key blocks, not with tile size, but the
    GPU entry's TMA setting, so that CPU tests run the load path the GPU runs. `causal` only sets
    REVERSE; tiles are shared by both settings. `documents`: the document-mask variant of the
    kernel, which may take a register cap (DOCUMENT_MAXNREG)."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {', '.join(map(repr, KERNELS))}, got {kernel!r}")
    return _table_config(kernel, block_d, dtype, causal, documents, interpreting())


# Host time matters as much as kernel time at short sequences (N=1024: a fwd+bwd is ~0.5 ms of GPU
# work), so what depends only on the shape class is computed once: configs, constants, capability.
def _table_key(block_d: int, dtype: torch.dtype) -> tuple[str, str]:
    """(padded head dim class, dtype class): how LAUNCH_TABLE and FUSED_FASTER are keyed."""
    return "d64" if block_d <= 64 else "d128" if block_d <= 128 else "d256", "fp32" if dtype == torch.float32 else "16bit"


@functools.lru_cache(maxsize=None)
def _table_config(kernel: str, block_d: int, dtype: torch.dtype, causal: bool, documents: bool, interpret: bool) -> KernelConfig:
    key = (kernel, *_table_key(block_d, dtype))
    config = LAUNCH_TABLE[key]
    if interpret:  # no registers to cap either
        return KernelConfig(64, 64, REVERSE=causal and config.REVERSE, TMA=config.TMA, TMA_DQ=config.TMA_DQ)
    maxnreg = DOCUMENT_MAXNREG.get(key) if documents else None
    return dataclasses.replace(config, REVERSE=causal and config.REVERSE, maxnreg=maxnreg or config.maxnreg)


@functools.lru_cache(maxsize=None)
def _capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


# ----------------------------------------------------------------------------------------------
# TMA rules
# ----------------------------------------------------------------------------------------------


def tma_ok(*tensors: torch.Tensor) -> bool:
    """Whether the kernels can build a (seqlen, head_dim) tensor descriptor over every head of
    each tensor: unit stride along head_dim, 16-byte aligned head starts and rows (TMA's rules),
    and a Hopper-or-newer GPU (or the interpreter, which emulates descriptors)."""
    device = tensors[0].device  # the launchers have checked that q, k, v share one device
    if device.type == "cuda" and _capability(device)[0] < 9:
        return False
    for t in tensors:
        *outer, row, last = t.stride()
        size = t.element_size()
        if last != 1 or row == 0 or t.data_ptr() % 16 or (row * size) % 16 or any((s * size) % 16 for s in outer):
            return False
    return True


def tma_reduce_ok(cfg: KernelConfig, dq_acc: torch.Tensor) -> bool:
    """Whether the fused backward adds its dQ shares by TMA reduce-add: asked for by the config,
    on a Hopper-or-newer GPU (the interpreter has no bulk reductions), into a buffer TMA can address."""
    return cfg.TMA_DQ and not interpreting() and tma_ok(dq_acc)


def _tma_scratch(size: int, alignment: int, stream) -> torch.Tensor:
    # device-side descriptors live in a small global workspace that Triton asks for at launch
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _ensure_allocator() -> None:
    """Give Triton a workspace allocator for the descriptors. Triton keeps it in a ContextVar,
    i.e. per thread, and autograd runs the backward in its own thread: so set it at each launch."""
    if not interpreting():
        triton.set_allocator(_tma_scratch)


# ----------------------------------------------------------------------------------------------
# Launchers: inputs in (B, H, N, D) layout, any strides; checked by the public functions
# ----------------------------------------------------------------------------------------------


def _launch_args(q: torch.Tensor) -> dict:
    """The kernels' shape constants (a cached dict: callers only unpack it)."""
    return _constants(q.shape[-1], q.dtype, interpreting(), torch.backends.cuda.matmul.allow_tf32)


@functools.lru_cache(maxsize=None)
def _constants(head_dim: int, dtype: torch.dtype, interpret: bool, allow_tf32: bool) -> dict:
    return dict(
        HEAD_DIM=head_dim,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),  # tl.dot needs K >= 16
        UPCAST=interpret and dtype == torch.bfloat16,
        # float32 inputs get true float32 products unless the user opted into TF32 globally
        DOT_PRECISION="ieee" if dtype == torch.float32 and not allow_tf32 else "tf32",
    )


@dataclasses.dataclass(frozen=True)
class HopperConfig:
    """Launch settings of the Hopper single-pass backward (backward_hopper.py, Gluon).

    BLOCK_M query rows per tile; BLOCK_N keys per program over num_warps consumer warps (16 keys
    per warp: 8 warps are FlashAttention-3's two warpgroups); STAGES slots in the Q / dO ring.
    REMAT_DESC: rebuild the K / V / dSᵀ shared-memory descriptors in the loop (at d=128, hoisted
    out of it they spill; at d=64 hoisting measured faster).
    STRIDED: load Q, dO, K, V through 4-D descriptors over the callers' strides instead of copying
    them contiguous first (the model's q, k, v are views of one projection): end to end at
    seq_len 8192, 119.7-119.8k vs 116.1-116.3k tokens/s without (docs/perf-notes.md, v8).
    L2_GROUP_MB (causal launches): the first key blocks (the heaviest) of groups of heads whose Q and
    dO fit this many MB go first; 0: key blocks fastest, head by head."""

    BLOCK_M: int = 64
    BLOCK_N: int = 128
    num_warps: int = 8
    STAGES: int = 2
    REMAT_DESC: bool = True
    STRIDED: bool = False
    L2_GROUP_MB: int = 0


@dataclasses.dataclass(frozen=True)
class HopperForwardConfig:
    """Launch settings of the Hopper forward (forward_hopper.py, Gluon): CONSUMERS warpgroups of 64
    query rows per program (2: 128 rows; 3: FlashAttention-3's 192-row tile, d=64 only: 192 rows
    of d=128 accumulators do not fit the register file), BLOCK_N keys per tile, STAGES slots in
    the K / V ring, CONSUMER_REGS registers per thread of each consumer warpgroup after the first
    (setmaxnreg; the producer warp gets 24, the first consumer what is left), STRIDED as
    HopperConfig's. PERSISTENT: one program per SM taking tile after tile (the next tile's Q and
    K / V load while the last one's output is written) instead of one program per tile."""

    BLOCK_N: int = 128
    STAGES: int = 2
    CONSUMERS: int = 2
    CONSUMER_REGS: int = 240
    STRIDED: bool = False
    PERSISTENT: bool = False


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
            config: KernelConfig | None = None, window_size: tuple[int, int] = (-1, -1),
            document_ids: torch.Tensor | None = None, tile_counter: torch.Tensor | None = None,
            kernel: str = "fastest") -> tuple[torch.Tensor, torch.Tensor]:
    """O (q's dtype and layout) and LSE (float32, (B, Hq, Nq)) in base 2: log2 Σ_j 2^{s_j·scale·log2(e)}.
    The backward launchers take it so; kernels.flash_attn's public functions convert.
    tile_counter: an int32 tensor the kernel adds 1 to per visited (query block, key block) tile.
    kernel: "tl" (forward.py, with config or the table's), "hopper" (forward_hopper.py, sm_90
    only) or "fastest" (fastest_forward's pick; "tl" when a config or tile_counter is given)."""
    if kernel not in FORWARD_KERNELS:
        raise ValueError(f"kernel must be one of {', '.join(map(repr, FORWARD_KERNELS))}, got {kernel!r}")
    documents = document_ids is not None
    if kernel == "fastest":
        kernel = "tl" if config is not None or tile_counter is not None else fastest_forward(q, k, documents)
    elif kernel == "hopper" and (reason := hopper_unsupported(q, k, documents)) is not None:
        raise ValueError(f"kernel='hopper' {reason}; use kernel='fastest' to fall back to the Triton kernel")
    if kernel == "hopper":
        from kernels.flash_attn.forward_hopper import forward_hopper

        return forward_hopper(q, k, v, causal, scale, HOPPER_FORWARD[_table_key(q.shape[-1], q.dtype)], window_size)
    batch, heads_q, seqlen_q, _ = q.shape
    heads_kv, seqlen_k = k.shape[1], k.shape[2]
    o = torch.empty_like(q)  # keeps q's memory layout, so a (B, N, H, D) view stays cheap to reshape
    lse2 = torch.empty((batch, heads_q, seqlen_q), device=q.device, dtype=torch.float32)
    consts = _launch_args(q)
    mask = resolve(causal, window_size, document_ids, seqlen_q, seqlen_k)
    cfg = config or kernel_config("fwd", consts["BLOCK_D"], q.dtype, mask.causal, mask.documents is not None)
    grid = (_cdiv(seqlen_q, cfg.BLOCK_M), heads_q, batch)
    fast_launch.launch(fwd_kernel, grid,
        q, k, v, o, lse2, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        heads_q, heads_q // heads_kv, seqlen_q, seqlen_k, scale * LOG2E.value,
        **mask.kernel_args(cfg.BLOCK_M, cfg.BLOCK_N, tile_counter), **cfg.launch_kwargs(k, v), **consts,
    )
    return o, lse2


def backward_delta(o: torch.Tensor, do: torch.Tensor) -> torch.Tensor:
    """delta = rowsum(dO ∘ O), float32 (B, Hq, Nq)."""
    batch, heads_q, seqlen_q, head_dim = o.shape
    delta = torch.empty((batch, heads_q, seqlen_q), device=o.device, dtype=torch.float32)
    block_m = 64
    fast_launch.launch(bwd_preprocess_kernel, (_cdiv(seqlen_q, block_m), heads_q, batch),
        o, do, delta, *o.stride(), *do.stride(), heads_q, seqlen_q,
        HEAD_DIM=head_dim, BLOCK_D=max(16, triton.next_power_of_2(head_dim)), BLOCK_M=block_m,
    )
    return delta


def _launch_key_blocks(do, q, k, v, lse2, delta, mask: KernelMask, scale: float, cfg: KernelConfig, consts: dict,
                       dq_acc: torch.Tensor | None, tile_counter: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """bwd_kv_kernel over (key blocks, kv heads, batch); dq_acc: the fused schedule's float32 dQ
    buffer (ATOMIC_DQ), or None for the deterministic pass, which has no dQ to write."""
    batch, heads_q, seqlen_q, _ = q.shape
    heads_kv, seqlen_k = k.shape[1], k.shape[2]
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    dq_args = (None,) * 5 if dq_acc is None else (dq_acc, *dq_acc.stride())
    tma_dq = dq_acc is not None and tma_reduce_ok(cfg, dq_acc)
    if tma_dq:
        _ensure_allocator()  # the dQ descriptor is built on the device, in Triton's workspace
    fast_launch.launch(bwd_kv_kernel, (_cdiv(seqlen_k, cfg.BLOCK_N), heads_kv, batch),
        q, k, v, do, lse2, delta, dk, dv, dq_args[0],
        *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dk.stride(), *dv.stride(), *dq_args[1:],
        heads_q, heads_q // heads_kv, seqlen_q, seqlen_k, scale * LOG2E.value, scale,
        **mask.kernel_args(cfg.BLOCK_N, cfg.BLOCK_M, tile_counter),
        ATOMIC_DQ=dq_acc is not None, TMA_DQ=tma_dq,
        **cfg.launch_kwargs(q, do), **consts,
    )
    return dk, dv


def backward_dkdv(do, q, k, v, lse2, delta, causal: bool, scale: float, config: KernelConfig | None = None,
                  window_size: tuple[int, int] = (-1, -1), document_ids: torch.Tensor | None = None,
                  tile_counter: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The deterministic schedule's second pass: dK, dV, from the delta the first one wrote."""
    consts = _launch_args(q)
    mask = resolve(causal, window_size, document_ids, q.shape[2], k.shape[2])
    cfg = config or kernel_config("bwd_dkdv", consts["BLOCK_D"], q.dtype, mask.causal, mask.documents is not None)
    return _launch_key_blocks(do, q, k, v, lse2, delta, mask, scale, cfg, consts, None, tile_counter)


def backward_dq(do, q, k, v, o, lse2, causal: bool, scale: float, config: KernelConfig | None = None,
                window_size: tuple[int, int] = (-1, -1), document_ids: torch.Tensor | None = None,
                tile_counter: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The deterministic schedule's first pass: dQ, and delta (float32 (B, Hq, Nq)) for the second."""
    batch, heads_q, seqlen_q, _ = q.shape
    heads_kv, seqlen_k = k.shape[1], k.shape[2]
    consts = _launch_args(q)
    mask = resolve(causal, window_size, document_ids, seqlen_q, seqlen_k)
    cfg = config or kernel_config("bwd_dq", consts["BLOCK_D"], q.dtype, mask.causal, mask.documents is not None)
    dq = torch.empty_like(q)
    delta = torch.empty((batch, heads_q, seqlen_q), device=q.device, dtype=torch.float32)
    fast_launch.launch(bwd_dq_kernel, (_cdiv(seqlen_q, cfg.BLOCK_M), heads_q, batch),
        q, k, v, o, do, lse2, delta, dq,
        *q.stride(), *k.stride(), *v.stride(), *o.stride(), *do.stride(), *dq.stride(),
        heads_q, heads_q // heads_kv, seqlen_q, seqlen_k, scale * LOG2E.value, scale,
        **mask.kernel_args(cfg.BLOCK_M, cfg.BLOCK_N, tile_counter), **cfg.launch_kwargs(k, v), **consts,
    )
    return dq, delta


def backward_fused(do, q, k, v, lse2, delta, causal: bool, scale: float, config: KernelConfig | None = None,
                   window_size: tuple[int, int] = (-1, -1), document_ids: torch.Tensor | None = None,
                   tile_counter: torch.Tensor | None = None, dq_float32: bool = False,
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The single-pass schedule: dK, dV and atomically summed dQ (dq_float32: the float32
    accumulator itself, contiguous, uncast)."""
    consts = _launch_args(q)
    mask = resolve(causal, window_size, document_ids, q.shape[2], k.shape[2])
    cfg = config or kernel_config("bwd_fused", consts["BLOCK_D"], q.dtype, mask.causal, mask.documents is not None)
    # every key block adds its share of dQ here: float32 (exact adds of the tiles; bf16 atomics also
    # lack interpreter support), zeroed
    dq_acc = torch.zeros(q.shape, device=q.device, dtype=torch.float32)
    dk, dv = _launch_key_blocks(do, q, k, v, lse2, delta, mask, scale, cfg, consts, dq_acc, tile_counter)
    if dq_float32:
        return dq_acc, dk, dv
    return torch.empty_like(q).copy_(dq_acc), dk, dv  # cast into q's layout, as the fake kernel promises


def hopper_unsupported(q: torch.Tensor, k: torch.Tensor, documents: bool = False) -> str | None:
    """Why the Hopper kernels (the Gluon forward and single-pass backward) can't take these inputs
    (documents: document ids given; causal masks and sliding windows they take), a reason to show
    the user; None if they can."""
    on_gpu = not interpreting() and q.device.type == "cuda"
    return hopper_reason(_capability(q.device) if on_gpu else None, q.dtype, q.shape[-1], documents,
                         max(q.numel(), k.numel()))


def hopper_reason(capability: tuple[int, int] | None, dtype: torch.dtype, head_dim: int, documents: bool,
                  numel: int) -> str | None:
    """hopper_unsupported's rules on plain facts (capability None: no GPU, or the interpreter)."""
    if capability is None:
        return "runs on a CUDA GPU only (Gluon has no CPU interpreter)"
    if capability != (9, 0):
        return f"needs an sm_90 GPU (Hopper's wgmma), this one is sm_{capability[0]}{capability[1]}"
    if dtype not in (torch.float16, torch.bfloat16):
        return f"takes float16 / bfloat16, got {dtype}"
    if head_dim not in (64, 128) or _table_key(head_dim, dtype) not in HOPPER_BACKWARD.keys() & HOPPER_FORWARD.keys():
        return f"takes head_dim 64 or 128, got {head_dim}"
    if documents:
        return "takes causal masks and sliding windows, not document ids"
    if numel >= 2**31:
        return f"indexes with int32 offsets: B·H·N·d must stay below 2³¹, got {numel}"
    if not _gluon_available():
        return f"needs Gluon's Hopper API (triton.experimental.gluon), which triton {triton.__version__} lacks"
    return None


@functools.lru_cache(maxsize=None)
def _gluon_available() -> bool:
    try:
        from kernels.flash_attn import backward_hopper  # noqa: F401
    except ImportError:
        return False
    return True


def fastest_schedule(q: torch.Tensor, k: torch.Tensor | None = None, documents: bool = False) -> str:
    """The backward schedule that measured fastest for these inputs, among the exact ones; the one
    `deterministic=False` runs. k: the keys (default: q's shape); documents: document ids given.

    The interpreter: fused (half the programs × key blocks of the two passes). An sm_90 GPU: the
    Gluon single-pass kernel (backward_hopper.py) where it takes the inputs and HOPPER_MIN_SEQLEN
    measured it ahead (docs/perf-notes.md, v7); else fused where its dQ adds go through TMA
    reduce-add and FUSED_FASTER measured it ahead (v4). Elsewhere two-pass: per-element float32
    atomics made the fused schedule slower on every shape measured (H200; no older GPU was
    measured, so they keep the schedule that needs no atomics)."""
    if interpreting():
        return "fused"
    if q.device.type != "cuda":
        return "two_pass"
    k = q if k is None else k
    return gpu_schedule(_capability(q.device), q.dtype, q.shape[-1], k.shape[2], documents, max(q.numel(), k.numel()))


def gpu_schedule(capability: tuple[int, int], dtype: torch.dtype, head_dim: int, seqlen_k: int, documents: bool,
                 numel: int) -> str:
    """fastest_schedule's pick on a GPU, from plain facts."""
    if capability[0] < 9:
        return "two_pass"
    if _hopper_ahead(HOPPER_MIN_SEQLEN, capability, dtype, head_dim, seqlen_k, documents, numel):
        return "hopper"
    return "fused" if FUSED_FASTER.get(_table_key(head_dim, dtype), False) else "two_pass"


def _hopper_ahead(min_seqlen: dict[tuple[str, str], int], capability: tuple[int, int], dtype: torch.dtype,
                  head_dim: int, seqlen_k: int, documents: bool, numel: int) -> bool:
    """Does a Hopper kernel take these inputs at a key length its table (min_seqlen) measured it
    ahead? (The tables were measured causal and unmasked; sliding windows follow them unmeasured.)"""
    return (seqlen_k >= min_seqlen.get(_table_key(head_dim, dtype), 2**62)
            and hopper_reason(capability, dtype, head_dim, documents, numel) is None)


# Register caps for the document-mask variants, (kernel, head dim class, dtype class) -> registers
# per thread. Compiled for sm_90 (scripts/kernel_resources.py, triton 3.6), the forward and dQ
# kernels at d=64 take 122 registers without documents, two 8-warp programs per SM, and 141 / 148
# with them, one per SM; capped at 128 they spill 28 / 8 bytes and fit two again. Measured on the
# H200 (docs/perf-notes.md, v8: bf16, d=64, N=32768, the corpus's documents and 8 equal ones):
# forward 14-17 % and fwd+bwd 8-10 % faster capped.
DOCUMENT_MAXNREG: dict[tuple[str, str, str], int] = {
    ("fwd", "d64", "16bit"): 128,
    ("bwd_dq", "d64", "16bit"): 128,
}

# (padded head dim, dtype class) where the fused schedule with TMA reduce-add beat the two passes
# on the H200 (fwd+bwd, N=1024..32768, causal and full): see docs/perf-notes.md, v4.
FUSED_FASTER: dict[tuple[str, str], bool] = {}

# The Hopper single-pass backward (backward_hopper.py): its launch settings per (head dim class,
# dtype class), and from which key length fastest_schedule picks it over the `tl` schedules
# (H200, bf16, 16 heads, B·N = 16384, causal and full: docs/perf-notes.md, v7). At d=64, the
# tiles FlashAttention-3 uses, 128 query rows: faster than 64 without a mask (v10) and, in two
# runs, under causal (v11); at d=128 128 rows do not fit shared memory.
HOPPER_BACKWARD: dict[tuple[str, str], HopperConfig] = {
    ("d64", "16bit"): HopperConfig(BLOCK_M=128, STAGES=2, STRIDED=True, L2_GROUP_MB=32),
    ("d128", "16bit"): HopperConfig(STAGES=2, REMAT_DESC=True, STRIDED=True, L2_GROUP_MB=32),
}
# Under a sliding window the d=64 backward keeps the 64-row tiles its window rows were measured
# with (a band has two masked edges per tile row; 128 rows measured slower there, v11).
HOPPER_BACKWARD_WINDOW: dict[tuple[str, str], HopperConfig] = {
    ("d64", "16bit"): HopperConfig(STAGES=2, REMAT_DESC=False, STRIDED=True, L2_GROUP_MB=32),
}
HOPPER_MIN_SEQLEN: dict[tuple[str, str], int] = {
    ("d64", "16bit"): 4096,  # two runs: at 4096 causal +5-7 %, full −2..+5 %; from 8192 +4-15 %; at 1024 −4-7 %
    ("d128", "16bit"): 0,    # ahead from N = 1024 (14-19 %)
}

# The Hopper forward (forward_hopper.py): its launch settings, and from which key length
# fastest_forward picks it over forward.py's kernel (H200, bf16, 16 heads, B·N = 16384, causal
# and full: docs/perf-notes.md, v8-v9). d=128: 16-20 % faster from N = 1024 (persistent: 1-4 %
# faster without a mask, 5-17 % slower under causal, so off). d=64, FlashAttention-3's 192-row
# tile (three consumer warpgroups) on a persistent grid: 4-10 % faster from N = 2048, causal and
# full; at 1024 even (full) or much slower (causal, measured before the causal tile order).
HOPPER_FORWARD: dict[tuple[str, str], HopperForwardConfig] = {
    ("d64", "16bit"): HopperForwardConfig(STAGES=2, CONSUMERS=3, CONSUMER_REGS=160, STRIDED=True, PERSISTENT=True),
    ("d128", "16bit"): HopperForwardConfig(STAGES=2, STRIDED=True),
}
HOPPER_FORWARD_MIN_SEQLEN: dict[tuple[str, str], int] = {
    ("d64", "16bit"): 2048,
    ("d128", "16bit"): 0,
}
FORWARD_KERNELS = ("tl", "hopper", "fastest")


def fastest_forward(q: torch.Tensor, k: torch.Tensor, documents: bool = False) -> str:
    """The forward kernel that measured fastest for these inputs: "hopper" on an sm_90 GPU where
    the Gluon kernel takes them and HOPPER_FORWARD_MIN_SEQLEN measured it ahead, else "tl"."""
    if interpreting() or q.device.type != "cuda":
        return "tl"
    return gpu_forward_kernel(_capability(q.device), q.dtype, q.shape[-1], k.shape[2], documents, max(q.numel(), k.numel()))


def gpu_forward_kernel(capability: tuple[int, int], dtype: torch.dtype, head_dim: int, seqlen_k: int, documents: bool,
                       numel: int) -> str:
    """fastest_forward's pick on a GPU, from plain facts."""
    return "hopper" if _hopper_ahead(HOPPER_FORWARD_MIN_SEQLEN, capability, dtype, head_dim, seqlen_k, documents,
                                     numel) else "tl"


SCHEDULES = ("two_pass", "fused", "hopper", "fastest")
# the schedules whose dQ is a float32 sum (of atomic / TMA reduce adds) cast at the end; under
# torch.compile the custom op hands that sum over uncast (op.py), and the cast fuses into the next kernel
FLOAT32_DQ_SCHEDULES = ("fused", "hopper")


def hopper_backward_config(head_dim: int, dtype: torch.dtype, window: bool) -> HopperConfig:
    """The Gluon backward's launch settings: HOPPER_BACKWARD's, or HOPPER_BACKWARD_WINDOW's where
    it has an entry and the call has a sliding window."""
    key = _table_key(head_dim, dtype)
    return HOPPER_BACKWARD_WINDOW.get(key, HOPPER_BACKWARD[key]) if window else HOPPER_BACKWARD[key]


def backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse2: torch.Tensor,
             causal: bool, scale: float, schedule: str = "two_pass", window_size: tuple[int, int] = (-1, -1),
             document_ids: torch.Tensor | None = None, dq_float32: bool = False,
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dQ, dK, dV) with the table's configs. schedule: "two_pass" (deterministic), "fused" (one
    pass, dQ summed by atomic adds), "hopper" (one pass in Gluon, sm_90 only) or "fastest"
    (fastest_schedule's pick for these inputs). dq_float32 (the schedules that sum dQ in float32,
    FLOAT32_DQ_SCHEDULES): dQ is that float32 sum, contiguous, not cast to q's dtype and layout."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(map(repr, SCHEDULES))}, got {schedule!r}")
    documents = document_ids is not None
    if schedule == "fastest":  # its pick has passed hopper_unsupported's checks
        schedule = fastest_schedule(q, k, documents)
    elif schedule == "hopper" and (reason := hopper_unsupported(q, k, documents)) is not None:
        raise ValueError(f"schedule='hopper' {reason}; use schedule='fastest' to fall back to the Triton kernels")
    if dq_float32 and schedule not in FLOAT32_DQ_SCHEDULES:
        raise ValueError(f"dq_float32=True needs a schedule that sums dQ in float32 ({', '.join(FLOAT32_DQ_SCHEDULES)}), "
                         f"got {schedule!r}")
    masks = dict(window_size=window_size, document_ids=document_ids)
    if schedule == "hopper":
        from kernels.flash_attn.backward_hopper import backward_hopper

        config = hopper_backward_config(q.shape[-1], q.dtype, window=tuple(window_size) != (-1, -1))
        return backward_hopper(do, q, k, v, lse2, backward_delta(o, do), causal, scale, config, dq_float32, window_size)
    if schedule == "fused":
        return backward_fused(do, q, k, v, lse2, backward_delta(o, do), causal, scale, **masks, dq_float32=dq_float32)
    dq, delta = backward_dq(do, q, k, v, o, lse2, causal, scale, **masks)
    dk, dv = backward_dkdv(do, q, k, v, lse2, delta, causal, scale, **masks)
    return dq, dk, dv
