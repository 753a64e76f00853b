"""Host time of our attention, piece by piece (wall µs per call, mean of N calls after warm-up, one
sync at the end), at a tiny shape (GPU time negligible: wall = host) and at 16x16x1024x64 causal,
the `tl` launches with fast_launch on (the default) and off, in the same process;
and a cProfile of the default fwd+bwd with autograd single-threaded (so the backward's Python runs
on the profiled thread)."""
import cProfile
import io
import json
import pstats
import sys

import torch
import torch.nn.functional as F
import wall
from torch.nn.attention import SDPBackend, sdpa_kernel

from kernels.flash_attn import check_inputs, check_masks, fast_launch, flash_attention, launch

out = sys.argv[1]
res = {}


def wall_us(fn, n=300):
    return wall.wall_us(fn, n, warmup=30)


def multi_and_single(r, label, fn, suffix=""):
    """fn timed with autograd multi-threaded (its default: the backward on its device thread) and single-threaded."""
    r[label + suffix] = wall_us(fn)
    with torch.autograd.set_multithreading_enabled(False):
        r[f"{label} single-thread autograd{suffix}"] = wall_us(fn)


for shape in ((1, 1, 128, 64), (1, 1, 128, 128), (16, 16, 1024, 64)):
    name = "x".join(map(str, shape))
    q, k, v = (torch.randn(*shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
    scale = shape[-1] ** -0.5
    o, lse2 = launch.forward(q, k, v, True, scale)
    r = {}
    r["check_inputs+masks"] = wall_us(lambda: (check_inputs(q, k, v, True, None, None), check_masks(q, k, (-1, -1), None)))
    r["launch.forward"] = wall_us(lambda: launch.forward(q, k, v, True, scale))
    r["launch.forward tl"] = wall_us(lambda: launch.forward(q, k, v, True, scale, kernel="tl"))
    r["launch.backward fastest=" + launch.fastest_schedule(q, k)] = wall_us(lambda: launch.backward(do, q, k, v, o, lse2, True, scale, "fastest"))
    r["launch.backward two_pass"] = wall_us(lambda: launch.backward(do, q, k, v, o, lse2, True, scale, "two_pass"))
    r["backward_delta"] = wall_us(lambda: launch.backward_delta(o, do))
    r["flash fwd only (requires grad)"] = wall_us(lambda: flash_attention(q, k, v, causal=True))
    fb = lambda: torch.autograd.grad(flash_attention(q, k, v, causal=True), (q, k, v), do)
    multi_and_single(r, "flash fwd+bwd", fb)

    # the same calls with every `tl` launch through Triton's own binding (kernels/flash_attn/fast_launch.py off)
    fast_launch.set_enabled(False)
    r["launch.forward tl, fast_launch off"] = wall_us(lambda: launch.forward(q, k, v, True, scale, kernel="tl"))
    r["launch.backward two_pass, fast_launch off"] = wall_us(lambda: launch.backward(do, q, k, v, o, lse2, True, scale, "two_pass"))
    multi_and_single(r, "flash fwd+bwd", fb, ", fast_launch off")
    fast_launch.set_enabled(True)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=True), (q, k, v), do)
    multi_and_single(r, "cudnn fwd+bwd", cudnn)
    res[name] = r
    print(name, json.dumps(r, indent=1), flush=True)
    if shape == (1, 1, 128, 64):
        torch.autograd.set_multithreading_enabled(False)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(200):
            fb()
        torch.cuda.synchronize()
        prof.disable()
        torch.autograd.set_multithreading_enabled(True)
        for key in ("tottime", "cumulative"):
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats(key).print_stats(45)
            text = s.getvalue()
            open(f"{out}/cprofile_{key}.txt", "w").write(text)
            print(text[:9000] if key == "tottime" else text[:6000])
json.dump(res, open(f"{out}/calls.json", "w"), indent=1)
