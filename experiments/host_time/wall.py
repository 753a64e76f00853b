"""The timer both scripts use: host wall time per call, where the GPU waits for the host."""
import time

import torch


def wall_us(fn, n: int, warmup: int, digits: int = 1) -> float:
    """Mean µs per call of `fn` over n calls after `warmup` untimed ones, one synchronize at each end."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return round((time.perf_counter() - t) / n * 1e6, digits)
