"""Correctness and timing of the Gluon backward kernels on the GPU (Hopper): dkdv.py's dK/dV pass
and the single-pass backward (kernels/flash_attn/backward_hopper.py, in hopper_variants.py's
configs), against our `tl` kernels (kernels/flash_attn/launch.py), float64 and cuDNN:

    PYTHONPATH=$PWD python3 experiments/hopper_backward/check.py --out $OUT/x.json [--quick]
        [--phase all|correctness|timing] [--variants NAME,... | --variants all]

1. correctness, per variant: every gradient the kernel makes (dK, dV; single-pass: dQ too) vs float64
   under the repo's exactness rule (tests/kernels/_attention_checks.assert_within_rule, factor 3,
   standards: autograd in the input dtype and kernels/reference.attention_backward_reference), and
   its max difference from the `tl` two-pass results (dK, dV: bitwise equal so far; dQ of the
   single-pass kernel: float32 adds in scheduling order, so not bitwise). The `tl` two-pass and fused
   schedules are judged the same way, as rows "tl" and "tl_fused". The sweep runs in one process
   per (head_dim, dtype, causal), so the compiles overlap and a crashed variant (which poisons its
   CUDA context) costs only its group: the group's other variants rerun in a fresh process.
   A variant that fails any case is not timed (one too big for a head dim's shared memory is
   not failed: it is timed where it fits).
2. timing: do_bench medians (warmup 25, rep 100), bf16, 16 heads, B·N = 16384:
     dkdv_tl, dkdv_<variant>          the dK/dV pass alone (lse2, delta precomputed)
     bwd_tl_two_pass, bwd_tl_fused    launch.backward, both schedules (delta included)
     bwd_tl_dq+dkdv_gluon             the two passes with the Gluon dK/dV pass (ws_wg2_s2)
     bwd_<hopper variant>             launch.backward_delta + the Gluon single-pass kernel (with
                                      the dQ buffer's zeroing and final cast)
     cudnn_bwd                        cuDNN's fwd+bwd minus its fwd (torch SDPA)
   TFLOP/s use the 5-matmul count for whole backwards (10·B·H·N²·d, halved under causal) and 4
   matmuls for the dK/dV pass.
The JSON is rewritten after every step, so a run cut short still leaves what it measured.
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import sys
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
for p in (HERE, ROOT, os.path.join(ROOT, "tests", "kernels")):
    if p not in sys.path:
        sys.path.insert(0, p)

SHAPES_N = [(1, 1), (77, 77), (200, 333), (333, 200), (1000, 1000), (1024, 1024)]
HEADS = [(4, 4), (4, 2)]
BATCHES = [1, 2]
# the dK/dV variants run by default: the two fastest measured (against the measured numbers in
# README.md: did the refactor change them?) and the same with REMAT_DESC (unmeasured); --variants all: every one
DEFAULT_DKDV = ("ws_wg2_s2", "ws_wg2_s3", "ws_wg2_s2_remat", "ws_wg2_s3_remat")
KERNEL_PREFIX = "hopper_"  # the single-pass kernel's variants (hopper_variants.py); the rest are dkdv.py's
CASE_KEYS = ("variant", "batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k", "head_dim", "dtype", "causal")


def _import_checks():
    """tests/kernels/_attention_checks (assert_within_rule & co); it imports pytest at the top,
    so stub pytest if the machine lacks it (only decorators are used at import time)."""
    try:
        import pytest  # noqa: F401
    except ImportError:
        stub = types.ModuleType("pytest")
        stub.fixture = lambda f=None, **kw: f if f else (lambda g: g)
        stub.MonkeyPatch = object
        stub.param = lambda *a, **kw: a
        stub.mark = types.SimpleNamespace(slow=None, gpu=None, skipif=lambda *a, **kw: None)
        sys.modules["pytest"] = stub
    import _attention_checks
    return _attention_checks


def kernel_of(variant: str) -> str:
    return "hopper" if variant.startswith(KERNEL_PREFIX) else "dkdv"


def run_variant(variant, do, q, k, v, lse2, delta_dkdv, delta_fused, causal, scale):
    """(dq or None, dk, dv) of one Gluon variant."""
    if kernel_of(variant) == "hopper":
        from hopper_variants import HOPPER_VARIANTS

        from kernels.flash_attn.backward_hopper import backward_hopper
        return backward_hopper(do, q, k, v, lse2, delta_fused, causal, scale, HOPPER_VARIANTS[variant])
    from dkdv import backward_dkdv_gluon
    return (None, *backward_dkdv_gluon(do, q, k, v, lse2, delta_dkdv, causal, scale, variant))


def correctness_group(args):
    """All correctness cases of one (head_dim, dtype, causal), for every variant (a worker process)."""
    head_dim, dtype_name, causal, variants, shapes = args
    import torch

    from kernels.flash_attn import launch
    from kernels.reference import attention_backward_reference, attention_reference

    checks = _import_checks()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
    out = []
    for batch, (hq, hkv), (nq, nk) in shapes:
        torch.manual_seed(batch * 1000003 + hq * 10007 + hkv * 1009 + nq * 101 + nk * 7 + head_dim + 2 * causal)
        case = dict(batch=batch, heads_q=hq, heads_kv=hkv, seqlen_q=nq, seqlen_k=nk, head_dim=head_dim,
                    dtype=dtype_name, causal=causal)
        try:
            q, k, v = checks.make_qkv(batch, hq, hkv, nq, nk, head_dim, dtype, requires_grad=False)
            do64 = torch.randn(q.shape, device=q.device, dtype=torch.float64)
            do = do64.to(dtype)
            scale = head_dim ** -0.5
            kw = dict(causal=causal, softmax_scale=None)
            _, ref = checks.run_fwd_bwd(attention_reference, *checks.float64(q, k, v), do64, **kw)
            _, std = checks.run_fwd_bwd(attention_reference, q, k, v, do64, dtype=None, **kw)
            formula = attention_backward_reference(q, k, v, do64, **kw)
            o, lse2 = launch.forward(q, k, v, causal, scale)
            dq_tl, delta = launch.backward_dq(do, q, k, v, o, lse2, causal, scale)
            dk_tl, dv_tl = launch.backward_dkdv(do, q, k, v, lse2, delta, causal, scale)
            delta_pre = launch.backward_delta(o, do)
            tl_fused = launch.backward_fused(do, q, k, v, lse2, delta_pre, causal, scale)
        except Exception as e:  # noqa: BLE001
            out.append(dict(case, variant="(setup)", ok=False, error=f"{type(e).__name__}: {e}"[:2000]))
            continue
        names = ("dQ", "dK", "dV")
        refs = dict(zip(names, ref))
        stds = {n: [std[i], formula[i]] for i, n in enumerate(names)}
        std_err = {n: max((s.double() - refs[n]).abs().max().item() for s in stds[n]) for n in names}
        tl = dict(zip(names, (dq_tl, dk_tl, dv_tl)))

        def judge(label, grads):
            rec = {}
            for n, g in zip(names, grads):
                if g is None:
                    continue
                rec[f"{n}_err"] = (g.double() - refs[n]).abs().max().item()
                rec[f"{n}_std_err"] = std_err[n]
                rec[f"{n}_vs_tl"] = (g.double() - tl[n].double()).abs().max().item()
                try:
                    checks.assert_within_rule(f"{label} {n}", g, refs[n], stds[n], 3.0)
                except AssertionError as e:
                    rec.setdefault("fail", []).append(str(e)[:600])
            return rec

        for label, grads in (("tl", (dq_tl, dk_tl, dv_tl)), ("tl_fused", tl_fused)):
            rec = judge(label, grads)
            out.append(dict(case, variant=label, ok="fail" not in rec, **rec))
        for var in variants:
            try:
                grads = run_variant(var, do, q, k, v, lse2, delta, delta_pre, causal, scale)
                torch.cuda.synchronize()
                rec = judge(var, grads)
                out.append(dict(case, variant=var, ok="fail" not in rec, **rec))
            except Exception as e:  # noqa: BLE001
                out.append(dict(case, variant=var, ok=False, error=f"{type(e).__name__}: {e}"[-2000:]))
                if _cuda_crash(e):  # the context is gone: the parent reruns the rest in a fresh process
                    return dict(records=out, crashed=var)
    return dict(records=out, crashed=None)


def _cuda_crash(e):
    msg = f"{type(e).__name__}: {e}"
    return "AcceleratorError" in msg or "CUDA error" in msg or "Triton Error [CUDA]" in msg


def run_correctness(variants, quick, timeout, results):
    import torch.multiprocessing as mp
    if quick:
        groups = [(64, "fp16", False, variants, [(1, (4, 4), (77, 77))]),
                  (128, "bf16", True, variants, [(2, (4, 2), (333, 200))])]
    else:
        shapes = list(itertools.product(BATCHES, HEADS, SHAPES_N))
        groups = [(d, dt, c, variants, shapes) for d in (64, 128) for dt in ("bf16", "fp16") for c in (False, True)]
    ctx = mp.get_context("spawn")
    recs, pending, seen = [], groups, set()
    deadline = time.time() + timeout
    while pending and time.time() < deadline:
        # one fresh process per group (maxtasksperchild=1): a crashed variant poisons its CUDA
        # context, so the group's other variants are rerun without it in the next round
        pool = ctx.Pool(len(pending), maxtasksperchild=1)
        try:  # a hung kernel (a barrier deadlock) must not eat the whole run
            outs = pool.map_async(correctness_group, pending).get(timeout=max(1.0, deadline - time.time()))
            pool.close()
        except mp.TimeoutError:
            recs.append(dict(variant="(all)", ok=False, error=f"correctness timed out after {timeout}s"))
            results["correctness_timeout"] = True
            pool.terminate()
            outs = []
        pool.join()
        nxt = []
        for group, res in zip(pending, outs):
            for r in res["records"]:
                key = tuple(r.get(k) for k in CASE_KEYS)
                if key not in seen:
                    seen.add(key)
                    recs.append(r)
            if res["crashed"]:
                rest = [v for v in group[3] if v != res["crashed"]]
                results.setdefault("crashes", []).append(dict(group=list(group[:3]), variant=res["crashed"]))
                if rest:
                    nxt.append((*group[:3], rest, group[4]))
        pending = nxt
    results["correctness_cases"] = recs
    summary = {}
    for r in recs:
        s = summary.setdefault(r["variant"], dict(cases=0, failed=0, errors=0, too_big=0, worst_ratio=0.0))
        s["cases"] += 1
        # a config that does not fit a head dim (shared memory) is not a wrong one: it is timed where it runs
        too_big = "OutOfResources" in r.get("error", "")
        s["too_big"] += too_big
        s["failed"] += not r["ok"] and not too_big
        s["errors"] += "error" in r and not too_big
        for n in ("dQ", "dK", "dV"):
            for key in (f"{n}_err", f"{n}_vs_tl"):
                if key in r:
                    s["max_" + key] = max(s.get("max_" + key, 0.0), r[key])
            # error / allowed by the standard (3 × standard error; the ulp floor not counted)
            if f"{n}_err" in r and r[f"{n}_std_err"] > 0:
                s["worst_ratio"] = max(s["worst_ratio"], r[f"{n}_err"] / (3 * r[f"{n}_std_err"] + 1e-5))
    results["correctness_summary"] = summary
    for var, s in summary.items():
        errs = " ".join(f"{k[4:]}={v:.3g}" for k, v in s.items() if k.startswith("max_"))
        print(f"  {var:30s} cases={s['cases']:4d} failed={s['failed']:3d} errors={s['errors']:3d} too_big={s['too_big']:3d} "
              f"err/(3·std)={s['worst_ratio']:.3f} {errs}", flush=True)
    for r in [r for r in recs if not r["ok"]][:12]:
        print("  FAIL", {k: r.get(k) for k in CASE_KEYS}, (r.get("error") or r.get("fail")), flush=True)
    return [v for v in variants if summary.get(v, {}).get("failed", 1) == 0]


def bench_shape(n, d, causal, variants):
    """One timing row: ms (and TFLOP/s) of every entry named in the header."""
    import torch
    import torch.nn.functional as F
    from dkdv import backward_dkdv_gluon
    from hopper_variants import HOPPER_VARIANTS
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    from kernels.flash_attn import launch
    from kernels.flash_attn.backward_hopper import backward_hopper

    heads = 16
    batch = max(1, 16384 // n)
    torch.manual_seed(0)
    q = torch.randn(batch, heads, n, d, device="cuda", dtype=torch.bfloat16)
    k, v, do = torch.randn_like(q), torch.randn_like(q), torch.randn_like(q)
    scale = d ** -0.5
    o, lse2 = launch.forward(q, k, v, causal, scale)
    _, delta = launch.backward_dq(do, q, k, v, o, lse2, causal, scale)
    matmul_flops = 2 * batch * heads * n * n * d * (0.5 if causal else 1.0)  # one N×N×d matmul
    row = dict(N=n, batch=batch, heads=heads, head_dim=d, causal=causal, dtype="bf16", ms={}, tflops={})

    def record(name, fn, matmuls):
        try:
            t = float(do_bench(fn, warmup=25, rep=100, return_mode="median"))
            row["ms"][name] = round(t, 4)
            row["tflops"][name] = round(matmuls * matmul_flops / t / 1e9, 1)
        except Exception as e:  # noqa: BLE001
            row["ms"][name] = None
            row.setdefault("errors", {})[name] = f"{type(e).__name__}: {e}"[-800:]

    record("dkdv_tl", lambda: launch.backward_dkdv(do, q, k, v, lse2, delta, causal, scale), 4)
    for var in (x for x in variants if kernel_of(x) == "dkdv"):
        record(f"dkdv_{var}", lambda var=var: backward_dkdv_gluon(do, q, k, v, lse2, delta, causal, scale, var), 4)
    record("bwd_tl_two_pass", lambda: launch.backward(do, q, k, v, o, lse2, causal, scale, schedule="two_pass"), 5)
    record("bwd_tl_fused", lambda: launch.backward(do, q, k, v, o, lse2, causal, scale, schedule="fused"), 5)

    def two_pass_gluon():
        _, dlt = launch.backward_dq(do, q, k, v, o, lse2, causal, scale)
        return backward_dkdv_gluon(do, q, k, v, lse2, dlt, causal, scale, "ws_wg2_s2")

    record("bwd_tl_dq+dkdv_gluon", two_pass_gluon, 5)
    for var in (x for x in variants if kernel_of(x) == "hopper"):
        record(f"bwd_{var}", lambda var=var: backward_hopper(do, q, k, v, lse2, launch.backward_delta(o, do),
                                                             causal, scale, HOPPER_VARIANTS[var]), 5)
    record("bwd_launch_fastest", lambda: launch.backward(do, q, k, v, o, lse2, causal, scale, schedule="fastest"), 5)
    # cuDNN: fwd+bwd minus fwd
    qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))

    def cudnn_fwd():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal, scale=scale)

    def cudnn_fwd_bwd():
        torch.autograd.grad(cudnn_fwd(), (qg, kg, vg), do)

    record("cudnn_fwd", lambda: cudnn_fwd().detach(), 2)
    record("cudnn_fwd_bwd", cudnn_fwd_bwd, 7)
    if row["ms"].get("cudnn_fwd") and row["ms"].get("cudnn_fwd_bwd"):
        t = row["ms"]["cudnn_fwd_bwd"] - row["ms"]["cudnn_fwd"]
        row["ms"]["cudnn_bwd"] = round(t, 4)
        row["tflops"]["cudnn_bwd"] = round(5 * matmul_flops / t / 1e9, 1)
    return row


def compiled_stats():
    """Registers / spills / shared memory of the dK/dV kernels this process compiled (the bf16 timing
    runs; compile_sm90.py has the single-pass kernel's)."""
    from dkdv import COMPILED
    stats = []
    for (kernel, var, d, dtype, causal), ck in COMPILED.items():
        rec = dict(kernel=kernel, variant=var, head_dim=d, dtype=dtype, causal=causal)
        try:
            ck._init_handles()
            rec.update(n_regs=ck.n_regs, n_spills=ck.n_spills, shared=ck.metadata.shared, num_warps=ck.metadata.num_warps)
        except Exception as e:  # noqa: BLE001
            rec.update(error=str(e)[:300])
        stats.append(rec)
        print("  compiled", rec, flush=True)
    return stats


def _write(path, results):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(results, f, indent=1, default=str)
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="two small correctness shapes per variant, one timing shape")
    ap.add_argument("--phase", default="all", choices=["all", "correctness", "timing"])
    ap.add_argument("--variants", help="comma-separated names from dkdv.VARIANTS / hopper_variants.HOPPER_VARIANTS, "
                                       "or 'all' (default: DEFAULT_DKDV and every hopper variant)")
    ap.add_argument("--bench-variants", help="comma-separated subset to time (default: those that passed)")
    ap.add_argument("--corr-timeout", type=float, default=300)
    ap.add_argument("--budget", type=float, default=480, help="stop timing new shapes after this many seconds from the start")
    args = ap.parse_args()
    t_start = time.time()

    import dkdv
    import torch
    import triton
    from hopper_variants import HOPPER_VARIANTS

    every = list(dkdv.VARIANTS) + list(HOPPER_VARIANTS)
    if args.variants == "all":
        variants = every
    elif args.variants:
        variants = args.variants.split(",")
    else:
        variants = list(DEFAULT_DKDV) + list(HOPPER_VARIANTS)
    unknown = [v for v in variants if v not in every]
    if unknown:
        raise SystemExit(f"unknown variants: {unknown}")
    results = dict(triton=triton.__version__, torch=torch.__version__, device=torch.cuda.get_device_name(),
                   variants={v: dataclasses.asdict(HOPPER_VARIANTS[v]) if kernel_of(v) == "hopper" else dkdv.VARIANTS[v]
                             for v in variants},
                   quick=args.quick)
    _write(args.out, results)

    passed = list(variants)
    if args.phase in ("all", "correctness"):
        print("correctness:", flush=True)
        passed = run_correctness(variants, args.quick, args.corr_timeout, results)
        results["passed_variants"] = passed
        print(f"correctness done ({time.time() - t_start:.0f}s); passed: {passed}", flush=True)
        _write(args.out, results)

    if args.phase in ("all", "timing"):
        bench_vars = args.bench_variants.split(",") if args.bench_variants else passed
        if args.quick:
            shapes = [(8192, 128, True)]
        else:  # most telling first: a run cut short by --budget keeps these
            shapes = [(n, d, c) for n in (8192, 1024, 32768) for d in (128, 64) for c in (True, False)]
        rows = results.setdefault("timing", [])
        for n, d, causal in shapes:
            if time.time() > t_start + args.budget:
                results.setdefault("skipped_timing_shapes", []).append(dict(N=n, head_dim=d, causal=causal))
                continue
            row = bench_shape(n, d, causal, bench_vars)
            rows.append(row)
            _write(args.out, results)
            print(f"N={n:6d} d={d:3d} {'causal' if causal else 'full  '} "
                  + " ".join(f"{name}={ms}" for name, ms in row["ms"].items() if name not in ("cudnn_fwd", "cudnn_fwd_bwd")),
                  flush=True)
            torch.cuda.empty_cache()
        results["compile_stats"] = compiled_stats()
    results["wall_s"] = round(time.time() - t_start, 1)
    _write(args.out, results)
    print(f"done in {results['wall_s']}s -> {args.out}", flush=True)


if __name__ == "__main__":
    main()
