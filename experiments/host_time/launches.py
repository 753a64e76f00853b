"""Where a launch's host time goes (wall µs per call, mean of 2000 calls, tiny shapes so the GPU waits
for the host): Triton's full `kernel[grid](...)`, its argument binder alone, and the compiled
kernel's launcher called directly with pre-bound arguments
descriptor builds
a CUDA allocation."""
import json
import sys

import torch
import wall
from triton import knobs
from triton.experimental.gluon import language as gl

from kernels.flash_attn import backward_hopper, gluon_tma, launch

out = sys.argv[1]
res = {}


def us(fn, n=2000):
    return wall.wall_us(fn, n, warmup=50, digits=2)


def capture(module, name):
    real, rec = getattr(module, name), {}

    class Proxy:
        def __getitem__(self, grid):
            def call(*a, **kw):
                rec.update(grid=grid, args=a, kwargs=kw)
                rec["ck"] = real[grid](*a, **kw)
                return rec["ck"]
            return call

        def __getattr__(self, n):
            return getattr(real, n)
    setattr(module, name, Proxy())
    return real, rec


def split(real, rec, label):
    grid, a, kw, ck = rec["grid"], rec["args"], rec["kwargs"], rec["ck"]
    dev = torch.cuda.current_device()
    binder = real.device_caches[dev][4]
    kw2 = dict(kw, debug=False, instrumentation_mode=knobs.compilation.instrumentation_mode)
    bound = list(binder(*a, **kw2)[0].values())
    g = tuple(grid) + (1,) * (3 - len(grid))
    stream = torch.cuda.current_stream().cuda_stream
    r = {"full kernel[grid](...)": us(lambda: real[grid](*a, **kw)),
         "binder alone": us(lambda: binder(*a, **kw2)),
         "ck.run with bound args": us(lambda: ck.run(*g, stream, ck.function, ck.packed_metadata, None, None, None, *bound)),
         "current stream": us(lambda: torch.cuda.current_stream().cuda_stream),
         "n_args": len(bound)}
    res[label] = r
    print(label, r, flush=True)


for d in (64, 128):
    q, k, v, do = (torch.randn(1, 1, 128, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    o, lse2 = launch.forward(q, k, v, True, 0.1, kernel="tl")
    for module, name, call, label in (
            (launch, "fwd_kernel", lambda: launch.forward(q, k, v, True, 0.1, kernel="tl"), "tl fwd"),
            (launch, "bwd_kv_kernel", lambda: launch.backward(do, q, k, v, o, lse2, True, 0.1, "two_pass"), "tl dkdv"),
            (backward_hopper, "bwd_hopper_kernel", lambda: launch.backward(do, q, k, v, o, lse2, True, 0.1, "hopper"), "gluon bwd")):
        real, rec = capture(module, name)
        call()
        split(real, rec, f"{label} d{d}")
        setattr(module, name, real)
    elem, qf = gluon_tma.gl_dtype(q.dtype), q.float()
    res[f"descs d{d}"] = {"operand_descs x4 strided": us(lambda: gluon_tma.operand_descs([(q, 64), (do, 64), (k, 128), (v, 128)], elem, True)),
                          "tma_desc 1": us(lambda: gluon_tma.tma_desc(qf, 64, gl.float32)),
                          "torch.empty_like": us(lambda: torch.empty_like(q)),
                          "torch.zeros fp32": us(lambda: torch.zeros(q.shape, device=q.device, dtype=torch.float32)),
                          "backward_delta": us(lambda: launch.backward_delta(o, do)),
                          "launch.backward hopper": us(lambda: launch.backward(do, q, k, v, o, lse2, True, 0.1, "hopper")),
                          "launch.backward two_pass": us(lambda: launch.backward(do, q, k, v, o, lse2, True, 0.1, "two_pass")),
                          "launch.forward hopper": us(lambda: launch.forward(q, k, v, True, 0.1, kernel="hopper")),
                          "launch.forward tl": us(lambda: launch.forward(q, k, v, True, 0.1, kernel="tl"))}
    print(f"descs d{d}", res[f"descs d{d}"], flush=True)
json.dump(res, open(f"{out}/launches.json", "w"), indent=1)
