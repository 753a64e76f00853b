"""Where autograd's device thread adds host time to our fwd+bwd: one call split at four
timestamps (call start, forward returned, backward body entered, backward body left, gradients
returned), with autograd multi-threaded (the default: the backward runs on autograd's CUDA device
thread) and single-threaded (it runs on the calling thread); and `launch.backward` alone on the
main thread and on a second Python thread. µs per call, mean of N calls after warm-up; no sync per
call, so at the tiny shape (GPU time negligible) the numbers are host time.

    python experiments/host_time/autograd_thread.py OUT    # writes OUT/autograd_thread.json
"""
import json
import sys
import threading
import time

import torch

from kernels.flash_attn import flash_attention, launch, op

N, WARMUP = 300, 30
out = sys.argv[1]
marks = {}
body = op._EagerAttention.backward


def timed_backward(ctx, do, dlse):
    marks["enter"] = time.perf_counter()
    marks["on_main_thread"] = threading.current_thread() is threading.main_thread()
    grads = body(ctx, do, dlse)
    marks["leave"] = time.perf_counter()
    return grads


op._EagerAttention.backward = staticmethod(timed_backward)  # this process only: a probe, not a change


def split_call(q, k, v, do) -> dict:
    parts = dict.fromkeys(("forward", "to_backward", "backward_body", "backward_to_return", "total"), 0.0)
    for i in range(WARMUP + N):
        t0 = time.perf_counter()
        o = flash_attention(q, k, v, causal=True)
        t1 = time.perf_counter()
        torch.autograd.grad(o, (q, k, v), do)
        t2 = time.perf_counter()
        if i >= WARMUP:
            for name, dt in (("forward", t1 - t0), ("to_backward", marks["enter"] - t1),
                             ("backward_body", marks["leave"] - marks["enter"]),
                             ("backward_to_return", t2 - marks["leave"]), ("total", t2 - t0)):
                parts[name] += dt
    torch.cuda.synchronize()
    return {**{name: round(s / N * 1e6, 1) for name, s in parts.items()}, "backward_on_main_thread": marks["on_main_thread"]}


def launch_backward_us(args) -> float:
    for _ in range(WARMUP):
        launch.backward(*args)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(N):
        launch.backward(*args)
    return round((time.perf_counter() - t) / N * 1e6, 1)


res = {}
for shape in ((1, 1, 128, 64), (16, 16, 1024, 64)):
    name = "x".join(map(str, shape))
    q, k, v = (torch.randn(*shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
    for multithreaded in (True, False):
        torch.autograd.set_multithreading_enabled(multithreaded)
        res[f"{name} fwd+bwd, autograd {'multi' if multithreaded else 'single'}-threaded"] = split_call(q, k, v, do)
    torch.autograd.set_multithreading_enabled(True)
    o, lse2 = launch.forward(q, k, v, True, shape[-1] ** -0.5)
    args = (do, q, k, v, o, lse2, True, shape[-1] ** -0.5, "fastest")
    res[f"{name} launch.backward, main thread"] = launch_backward_us(args)
    other = {}
    worker = threading.Thread(target=lambda: other.setdefault("us", launch_backward_us(args)))
    worker.start()
    worker.join()
    res[f"{name} launch.backward, another Python thread"] = other["us"]
    torch.cuda.synchronize()
print(json.dumps(res, indent=1))
json.dump(res, open(f"{out}/autograd_thread.json", "w"), indent=1)
