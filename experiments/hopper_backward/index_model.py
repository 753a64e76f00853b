"""A float64 numpy model of the single-pass kernel's tile and index logic
(kernels/flash_attn/backward_hopper.py), checked against dense attention
gradients on the CPU (no GPU, no triton):

    python experiments/hopper_backward/index_model.py

It follows the kernel step by step: one program per (key block, kv head, batch); a flat loop over
(query head of the GQA group, query block) whose tiles are rows [row, row + BLOCK_M) of the
flattened (B·Hq·Nq, d) tensors (TMA: rows past a head's end are the next head's, past the tensor's
end zeros); lse2 = +inf on rows ≥ Nq; the causal mask on diagonal tiles only (query blocks below
full_lo); the key-tail mask (non-causal, last key block); each tile's dQ share added over the
flattened rows and clipped at the buffer's end (the TMA reduce). What it cannot check: anything
about Gluon itself (layouts, barriers, async proxies); check.py does that on the GPU.
--no-key-tail drops the key-tail mask, to see the check catch it.
"""
import argparse

import numpy as np

LOG2E = 1.4426950408889634


def cdiv(a, b):
    return -(-a // b)


def dense(q, k, v, do, causal, scale):
    """Reference gradients, and lse2 (base 2, +inf on rows that see no key) and delta."""
    group = q.shape[1] // k.shape[1]
    nq, nk = q.shape[2], k.shape[2]
    kk, vv = np.repeat(k, group, 1), np.repeat(v, group, 1)
    s = q @ kk.transpose(0, 1, 3, 2) * scale
    if causal:
        s = np.where(np.arange(nk)[None, :] <= np.arange(nq)[:, None] + nk - nq, s, -np.inf)
    mx = s.max(-1, keepdims=True)
    mx = np.where(np.isfinite(mx), mx, 0.0)
    e = np.exp(s - mx)
    den = e.sum(-1, keepdims=True)
    p = e / np.where(den > 0, den, 1.0)
    o = p @ vv
    delta = (do * o).sum(-1)
    ds = p * (do @ vv.transpose(0, 1, 3, 2) - delta[..., None])
    dq = ds @ kk * scale
    dk = (ds.transpose(0, 1, 3, 2) @ q * scale).reshape(*k.shape[:2], group, *k.shape[2:]).sum(2)
    dv = (p.transpose(0, 1, 3, 2) @ do).reshape(*k.shape[:2], group, *k.shape[2:]).sum(2)
    with np.errstate(divide="ignore"):
        lse2 = np.where(den[..., 0] > 0, np.log2(den[..., 0]) + mx[..., 0] * LOG2E, np.inf)
    return dq, dk, dv, lse2, delta


def tma_rows(t, r0, n):
    """Rows [r0, r0 + n) of a 2-D tensor as a TMA load sees them: zeros past the end."""
    out = np.zeros((n, t.shape[1]))
    hi = min(r0 + n, t.shape[0])
    out[:hi - r0] = t[r0:hi]
    return out


def fused_model(q, k, v, do, lse2, delta, causal, scale, block_m=64, block_n=128, key_tail_mask=True):
    batch, heads_q, nq, d = q.shape
    heads_kv, nk = k.shape[1], k.shape[2]
    group = heads_q // heads_kv
    qf, dof, kf, vf = (t.reshape(-1, d) for t in (q, do, k, v))
    lse_f, delta_f = np.pad(lse2.reshape(-1), (0, block_m)), np.pad(delta.reshape(-1), (0, block_m))
    dq_f = np.zeros_like(qf)
    dk, dv = np.zeros_like(k), np.zeros_like(v)
    offset = nk - nq
    for b in range(batch):
        for kvh in range(heads_kv):
            for pid in range(cdiv(nk, block_n)):
                start_n = pid * block_n
                kv_row0 = (b * heads_kv + kvh) * nk
                q_row0 = (b * heads_q + kvh * group) * nq
                kt, vt = tma_rows(kf, kv_row0 + start_n, block_n), tma_rows(vf, kv_row0 + start_n, block_n)
                if causal:  # dkdv._query_range
                    lo = max(start_n - offset, 0) // block_m * block_m
                    full_lo = min(max(lo, cdiv(max(start_n + block_n - 1 - offset, 0), block_m) * block_m), nq)
                else:
                    lo = full_lo = 0
                n_m = cdiv(nq - lo, block_m)
                offs_n = start_n + np.arange(block_n)
                key_tail = start_n + block_n > nk
                acc_k, acc_v = np.zeros((block_n, d)), np.zeros((block_n, d))
                for it in range(group * n_m):  # dkdv._tile_row
                    g = it // n_m
                    m = lo + (it - g * n_m) * block_m
                    row = q_row0 + g * nq + m
                    rows = m + np.arange(block_m)
                    qt, dot = tma_rows(qf, row, block_m), tma_rows(dof, row, block_m)
                    lse_t = np.where(rows < nq, lse_f[row:row + block_m], np.inf)
                    p_t = np.exp2(kt @ qt.T * scale * LOG2E - lse_t[None, :])
                    if causal:
                        if m < full_lo:
                            p_t = np.where(offs_n[:, None] <= rows[None, :] + offset, p_t, 0.0)
                    elif key_tail_mask and key_tail:
                        p_t = np.where(offs_n[:, None] < nk, p_t, 0.0)
                    ds_t = p_t * (vt @ dot.T - delta_f[row:row + block_m][None, :])
                    acc_v += p_t @ dot
                    acc_k += ds_t @ qt
                    share = ds_t.T @ kt * scale
                    hi = min(row + block_m, dq_f.shape[0])
                    dq_f[row:hi] += share[:hi - row]
                ok = offs_n < nk
                dk[b, kvh, start_n:start_n + block_n] = (acc_k * scale)[ok]
                dv[b, kvh, start_n:start_n + block_n] = acc_v[ok]
    return dq_f.reshape(q.shape), dk, dv


CASES = [  # batch, heads_q, heads_kv, Nq, Nk, causal (check.py's odd lengths, GQA, Nq ≠ Nk, 1 × 1)
    (1, 4, 4, 77, 77, False), (2, 4, 2, 333, 200, True), (2, 4, 2, 200, 333, False), (1, 2, 1, 1, 1, True),
    (2, 4, 2, 1000, 1000, True), (1, 2, 2, 130, 77, False), (2, 2, 1, 64, 256, True), (1, 4, 2, 333, 200, False),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-key-tail", action="store_true")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    worst = 0.0
    for batch, hq, hkv, nq, nk, causal in CASES:
        d = 64
        q, do = rng.standard_normal((batch, hq, nq, d)), rng.standard_normal((batch, hq, nq, d))
        k, v = rng.standard_normal((batch, hkv, nk, d)), rng.standard_normal((batch, hkv, nk, d))
        scale = d ** -0.5
        dq, dk, dv, lse2, delta = dense(q, k, v, do, causal, scale)
        got = fused_model(q, k, v, do, lse2, delta, causal, scale, key_tail_mask=not args.no_key_tail)
        errs = [float(np.abs(a - b).max()) for a, b in zip((dq, dk, dv), got)]
        worst = max(worst, *errs)
        print(f"B={batch} Hq={hq} Hkv={hkv} Nq={nq:4d} Nk={nk:4d} {'causal' if causal else 'full  '} "
              f"max|err| dQ {errs[0]:.1e} dK {errs[1]:.1e} dV {errs[2]:.1e}")
    print(f"worst {worst:.1e}: {'OK' if worst < 1e-10 else 'MISMATCH'}")
    return 0 if worst < 1e-10 else 1


if __name__ == "__main__":
    raise SystemExit(main())
