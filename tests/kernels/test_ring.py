"""kernels/ring.py: ring attention over 2 and 4 ranks against one-process attention, by the exactness
rule (docs/DESIGN.md), causal and full, float32 and bfloat16, GQA; the zigzag split and its steps.

On the CPU the ranks are gloo processes started by torchrun's agent and our kernel runs in the
Triton interpreter (launches marked slow). The ring's steps also run in one process, the ranks as
threads passing blocks through queues: on one GPU that checks the ring over the kernels it runs there
(the Gluon forward and backward from 2048 / 4096 keys) without a second GPU. PyTorch's context parallel (the sdpa path) rings only its
CUDA SDPA kernels, so on the CPU it is checked for the split it makes (the same tokens per rank as
ours); its attention is checked against one-process SDPA on two GPUs (marked gpu).
"""

import os
import queue
import threading
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from _attention_checks import assert_within_rule, float64, make_qkv, run_fwd_bwd
from _torchrun import run_on_ranks

from kernels.reference import attention_backward_reference, attention_reference, causal_mask
from kernels.ring import _backward, _forward, _step_block, ring_flash_attention, zigzag_indices
from training.distributed import record_failure

SEQ = 24  # 2·cp chunks of 6 (cp=2) or 3 (cp=4) tokens
FULL_SEQ_SDPA = 26  # divisible by cp=2, not by 2·cp: PyTorch then splits contiguously (its load balancer is causal-only)
CASES = [(causal, dtype) for causal in (True, False) for dtype in (torch.float32, torch.bfloat16)]
# Each launch: causal and full, one in each dtype (the interpreter's time goes per ring step and case)
CASES_BY_CP = {2: [(True, torch.bfloat16), (False, torch.float32)], 4: [(True, torch.float32), (False, torch.bfloat16)]}


def case_ids(case) -> str:
    causal, dtype = case
    return f"{'causal' if causal else 'full'}-{str(dtype).removeprefix('torch.')}"


@pytest.mark.parametrize("cp", [1, 2, 3, 4])
def test_zigzag_steps_cover_each_visible_pair_once_with_equal_work(cp):
    """The ring's step blocks (which queries meet which keys, causal or not) over all steps and ranks
    are exactly the causal mask of the whole sequence, and every step after the first costs the same."""
    n = 4 * cp  # chunks of 2
    owner = torch.empty(n, dtype=torch.long)
    seen = torch.zeros(n, n, dtype=torch.long)
    for rank in range(cp):
        owner[zigzag_indices(n, cp, rank)] = rank
    assert torch.equal(torch.sort(torch.cat([zigzag_indices(n, cp, r) for r in range(cp)])).values, torch.arange(n))
    for rank in range(cp):
        ring = SimpleNamespace(rank=rank, size=cp)
        mine = zigzag_indices(n, cp, rank)
        for step in range(cp):
            theirs = zigzag_indices(n, cp, (rank - step) % cp)
            rows, cols, causal = _step_block(step, ring, True, len(mine))
            q, k = mine[rows], theirs[cols]
            block = causal_mask(len(q), len(k)) if causal else torch.ones(len(q), len(k), dtype=torch.bool)
            seen[q[:, None], k[None, :]] += block
            assert bool((k[None, :] <= q[:, None])[block].all()), f"rank {rank} step {step} meets a future key"
            if step:
                assert block.sum() == (n // cp) ** 2 // 2, f"rank {rank} step {step}: {int(block.sum())} pairs"
    assert torch.equal(seen, causal_mask(n, n).long()), "a visible pair is missed or met twice"


def _ring_worker(cases: list, sdpa: bool) -> list:
    """One rank: ring attention on its zigzag tokens of each case (and PyTorch's context parallel on
    CUDA when `sdpa`); returns its rows of out, dq, dk, dv per case, and PyTorch's split of 0..SEQ-1."""
    cuda = torch.cuda.is_available()
    torch.set_num_threads(1)
    if cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.experimental import context_parallel

        rank, cp = dist.get_rank(), dist.get_world_size()
        mesh = init_device_mesh(device.type, (cp,))
        results = []
        for causal, q, k, v, do in cases:
            mine = zigzag_indices(q.shape[2], cp, rank)
            leaves = [t[:, :, mine].to(device).requires_grad_() for t in (q, k, v)]
            out = ring_flash_attention(*leaves, causal, dist.group.WORLD)
            out.backward(do[:, :, mine].to(device))
            results.append([t.cpu() for t in (out.detach(), *(leaf.grad for leaf in leaves))])
        split = torch.arange(SEQ)[None].repeat(2, 1)  # what PyTorch's context parallel gives this rank
        with context_parallel(mesh, buffers=[split], buffer_seq_dims=[1], no_restore_buffers={split}):
            pass
        sdpa_results = []
        for causal, q, k, v, do in cases if sdpa else []:
            if not causal:  # a length PyTorch splits contiguously
                q, k, v, do = (torch.cat([t, t[:, :, : FULL_SEQ_SDPA - SEQ]], dim=2) for t in (q, k, v, do))
            buffers = [t.to(device) for t in (q, k, v, do)]
            with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2] * 4, no_restore_buffers=set(buffers)):
                leaves = [t.requires_grad_() for t in buffers[:3]]
                out = F.scaled_dot_product_attention(*leaves, is_causal=causal)
                out.backward(buffers[3])
            sdpa_results.append([t.cpu() for t in (out.detach(), *(leaf.grad for leaf in leaves))])
        return results, split, sdpa_results
    except BaseException as err:
        record_failure(err)  # the launcher's report then shows this rank's assertion or error
        raise
    finally:
        dist.destroy_process_group()


def _make_cases(heads_kv: int, which: list = CASES) -> list:
    cases = []  # on the CPU: they travel to the ranks pickled, and each moves them to its device
    for causal, dtype in which:
        q, k, v = (t.cpu() for t in make_qkv(1, 2, heads_kv, SEQ, SEQ, 16, dtype, requires_grad=False))
        cases.append((causal, q, k, v, torch.randn(q.shape, dtype=torch.float64).to(dtype)))
    return cases


def _check(name: str, got: list, causal: bool, q, k, v, do) -> None:
    """The exactness rule for whole-sequence out, dq, dk, dv assembled from the ranks (references on the CPU)."""
    kw = dict(causal=causal)
    ref, ref_grads = run_fwd_bwd(attention_reference, *float64(q, k, v), do.double(), **kw)
    std, std_grads = run_fwd_bwd(attention_reference, q, k, v, do, dtype=None, **kw)
    formula_grads = attention_backward_reference(q, k, v, do.double(), **kw)
    assert_within_rule(f"{name} O", got[0], ref, std, 2.0)
    for label, g, r, s, f in zip(("dQ", "dK", "dV"), got[1:], ref_grads, std_grads, formula_grads):
        assert_within_rule(f"{name} {label}", g, r, [s, f], 3.0)


def _assemble(per_rank: list, layout: list[torch.Tensor]) -> list[torch.Tensor]:
    """Whole-sequence tensors from each rank's rows, rank r's rows at positions layout[r]."""
    whole = []
    for i in range(len(per_rank[0])):
        parts = [rows[i] for rows in per_rank]
        t = parts[0].new_empty(*parts[0].shape[:2], sum(p.shape[2] for p in parts), parts[0].shape[3])
        for part, where in zip(parts, layout):
            t[:, :, where] = part
        whole.append(t)
    return whole


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="gloo ranks run the kernel in the CPU interpreter, which is off "
                    "on a CUDA machine; there the NCCL test below covers the ring")
@pytest.mark.parametrize("cp", [2, 4])
def test_ring_attention_matches_one_process_attention(tmp_path, cp):
    cases = _make_cases(heads_kv=1, which=CASES_BY_CP[cp])  # GQA: 2 query heads read 1 key/value head
    returned = run_on_ranks(tmp_path, cp, _ring_worker, cases, False)
    layout = [zigzag_indices(SEQ, cp, r) for r in range(cp)]
    for i, (causal, q, k, v, do) in enumerate(cases):
        got = _assemble([returned[r][0][i] for r in range(cp)], layout)
        _check(f"cp={cp} {case_ids((causal, q.dtype))}", got, causal, q, k, v, do)
    for r in range(cp):  # PyTorch's head-tail load balancer keeps the same tokens on each rank as ours
        assert torch.equal(returned[r][1][0], layout[r]), (r, returned[r][1][0].tolist(), layout[r].tolist())


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs (NCCL ranks)")
def test_ring_and_pytorch_context_parallel_match_one_process_attention_on_two_gpus(tmp_path):
    """Our ring and PyTorch's context parallel SDPA (the two CP attentions of train.py) on 2 GPUs."""
    flash_cases, sdpa_cases = _make_cases(heads_kv=1), _make_cases(heads_kv=2)
    returned = run_on_ranks(tmp_path, 2, _ring_worker, flash_cases, False)
    zigzag = [zigzag_indices(SEQ, 2, r) for r in range(2)]
    for i, (causal, q, k, v, do) in enumerate(flash_cases):
        _check(f"flash {case_ids((causal, q.dtype))}", _assemble([returned[r][0][i] for r in range(2)], zigzag), causal,
               q, k, v, do)
    returned = run_on_ranks(tmp_path, 2, _ring_worker, sdpa_cases, True)
    contiguous = list(torch.arange(FULL_SEQ_SDPA).chunk(2))
    for i, (causal, q, k, v, do) in enumerate(sdpa_cases):
        if not causal:
            q, k, v, do = (torch.cat([t, t[:, :, : FULL_SEQ_SDPA - SEQ]], dim=2) for t in (q, k, v, do))
        got = _assemble([returned[r][2][i] for r in range(2)], zigzag if causal else contiguous)
        _check(f"sdpa {case_ids((causal, q.dtype))}", got, causal, q, k, v, do)


class _ThreadRing:
    """kernels.ring._Ring for ranks that are threads of one process. One thread runs at a time (it
    holds `baton`, given up only while waiting for a block), so the kernels never run concurrently:
    the CPU interpreter and Triton's compile caches are not thread-safe."""

    def __init__(self, rank: int, size: int, mailboxes: list[queue.Queue], baton: threading.Lock) -> None:
        self.rank, self.size, self.mailboxes, self.baton = rank, size, mailboxes, baton

    def pass_on(self, *tensors: torch.Tensor) -> tuple[list[torch.Tensor], list]:
        self.mailboxes[(self.rank + 1) % self.size].put([t.clone() for t in tensors])
        received = [torch.empty_like(t) for t in tensors]
        return received, [SimpleNamespace(wait=lambda: self._arrive(received))]

    def _arrive(self, received: list[torch.Tensor]) -> None:
        self.baton.release()
        try:
            sent = self.mailboxes[self.rank].get(timeout=600)
        finally:
            self.baton.acquire()
        if sent is None:
            raise RuntimeError("another rank failed")
        for buffer, tensor in zip(received, sent):
            buffer.copy_(tensor)


def _ring_in_threads(cp: int, causal: bool, q, k, v, do) -> list[torch.Tensor]:
    """Whole-sequence out, dq, dk, dv of the ring's forward and backward run by cp threads."""
    mailboxes, baton = [queue.Queue() for _ in range(cp)], threading.Lock()
    layout = [zigzag_indices(q.shape[2], cp, r).to(q.device) for r in range(cp)]
    per_rank, errors = [None] * cp, []

    def rank_main(rank: int) -> None:
        with baton:
            try:
                ring = _ThreadRing(rank, cp, mailboxes, baton)
                mine = [t[:, :, layout[rank]].contiguous() for t in (q, k, v, do)]
                out, lse = _forward(*mine[:3], causal, None, ring)
                per_rank[rank] = [out, *_backward(mine[3], *mine[:3], out, lse, causal, None, None, ring)]
            except BaseException as err:  # wake the others, then report it from the main thread
                errors.append(err)
                for box in mailboxes:
                    box.put(None)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(cp)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return _assemble(per_rank, layout)


@pytest.mark.parametrize("cp", [2, 3])
@pytest.mark.parametrize("case", CASES, ids=case_ids)
def test_ring_steps_in_one_process_match_one_process_attention(cp, case):
    """ring.py's forward and backward (the merge by lse, the zigzag steps, dK/dV travelling with
    their block), the ranks as threads: small on the CPU; at one GPU's test size see below."""
    causal, dtype = case
    seq = 2 * cp * 5  # chunks of 5 tokens
    q, k, v = make_qkv(1, 2, 1, seq, seq, 16, dtype, requires_grad=False)
    do = torch.randn(q.shape, dtype=torch.float64, device=q.device).to(dtype)
    _check(f"cp={cp} {case_ids(case)}", _ring_in_threads(cp, causal, q, k, v, do), causal, q, k, v, do)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("cp, seq", [(2, 8192), (4, 16384)])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_ring_steps_on_one_gpu_match_one_process_attention(cp, seq, causal):
    """GPT-2 medium's head size (d=64, bf16, GQA 2:1) at lengths where the ring's steps run the kernels
    a two-GPU ring would: 4096 local tokens, steps of 2048 and 4096 keys (Gluon forward from 2048
    keys; Gluon backward from 4096 on an H100/H200, the Triton single-pass below)."""
    q, k, v = make_qkv(1, 2, 1, seq, seq, 64, torch.bfloat16, requires_grad=False)
    do = torch.randn(q.shape, dtype=torch.float64, device=q.device).to(torch.bfloat16)
    _check(f"cp={cp} N={seq} {'causal' if causal else 'full'}", _ring_in_threads(cp, causal, q, k, v, do), causal, q, k, v, do)
