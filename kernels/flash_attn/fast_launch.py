"""Launching a compiled Triton kernel again without Triton's per-call argument binding.

`kernel[grid](*args, **kwargs)` binds and specialises every argument on every call: of the ~37 µs
of host time one `tl` launch of ours takes on an H200, ~29 are that (experiments/host_time), and at
N ≤ 2048 an eager fwd+bwd is host-bound (docs/perf-notes.md, v11). `launch` sends the first call
for a key through Triton, which compiles the kernel and returns it, and launches that compiled
kernel directly on later calls with the same key. The key is finer than Triton's specialisation, so
the cached kernel is always the one Triton would have picked: every tensor's dtype and whether its
address is 16-byte aligned, every other argument's type and value (floats by type only: Triton
passes them at run time, unspecialised), and the launch options. It runs on the triton versions it
was checked with (CHECKED_TRITON) and not under the interpreter; elsewhere Triton's own path runs.
"""
from __future__ import annotations

import functools
from typing import Any

import torch
import triton

CHECKED_TRITON = ("3.6.",)
MAX_KEYS = 256  # per kernel: a process's shapes; past it, new keys take Triton's path (no unbounded growth)


_SWITCHED_ON = True  # set_enabled(False): every launch through Triton's binding (for A/B timings, experiments/host_time)


@functools.cache
def supported() -> bool:
    """Whether this process can reuse compiled kernels: a checked triton, not the interpreter (fixed at import)."""
    from kernels.flash_attn.launch import interpreting  # launch imports this module: no cycle at import

    return triton.__version__.startswith(CHECKED_TRITON) and not interpreting()


def enabled() -> bool:
    """Whether `launch` reuses compiled kernels now: supported() and not switched off."""
    return _SWITCHED_ON and supported()


def set_enabled(on: bool) -> None:
    """Switch the reuse on or off for the whole process (off: Triton's own path, as before this module)."""
    global _SWITCHED_ON
    _SWITCHED_ON = bool(on)


class _Compiled:
    """One kernel's compiled variants by key, and how to order a call's arguments as its signature."""

    def __init__(self, kernel) -> None:
        self.names = list(kernel.arg_names)
        self.defaults = [p.default for p in kernel.params]
        self.by_key: dict[tuple, Any] = {}
        self.positions: dict[tuple, tuple[tuple[int, ...], tuple[int, ...]]] = {}  # types -> tensor, float indices
        self.plans: dict[tuple, tuple[list, list]] = {}  # (len(args), *keywords) -> (the rest's names, defaults), options

    def arguments(self, args: tuple, kwargs: dict) -> tuple[list, tuple]:
        """Every parameter's value in signature order (keywords or defaults after the positional
        ones, as Triton's binder fills them), and the other keywords, the launch options, sorted.
        How to fill them is worked out once per (number of positional arguments, keywords' names)."""
        shape = (len(args), *kwargs)
        plan = self.plans.get(shape)
        if plan is None:
            tail = list(zip(self.names[len(args):], self.defaults[len(args):]))
            plan = self.plans[shape] = tail, sorted(k for k in kwargs if k not in self.names)
        tail, options = plan
        return [*args, *[kwargs.get(name, default) for name, default in tail]], tuple([(k, kwargs[k]) for k in options])

    def key(self, values: list, options: tuple) -> tuple:
        """The arguments' types, then their values with each tensor as (dtype, 16-byte aligned) and
        each float left out. The key holds no tensor, so it keeps none alive."""
        types = tuple(map(type, values))
        positions = self.positions.get(types)
        if positions is None:
            positions = self.positions[types] = (
                tuple(i for i, t in enumerate(types) if issubclass(t, torch.Tensor)),
                tuple(i for i, t in enumerate(types) if t is float))
        spec = list(values)
        for i in positions[0]:
            spec[i] = spec[i].dtype, spec[i].data_ptr() % 16 == 0
        for i in positions[1]:
            spec[i] = None
        return types, tuple(spec), options


_COMPILED: dict[tuple[Any, int], _Compiled] = {}  # (kernel, CUDA device) ->


def launch(kernel, grid: tuple[int, ...], *args: Any, **kwargs: Any) -> None:
    """`kernel[grid](*args, **kwargs)`, the compiled kernel reused where the key allows it."""
    if not enabled() or kernel.pre_run_hooks:
        kernel[grid](*args, **kwargs)
        return
    device = torch.cuda.current_device()  # a compiled kernel is loaded on one device, as Triton's caches are per device
    compiled = _COMPILED.get((kernel, device))
    if compiled is None:
        compiled = _COMPILED[kernel, device] = _Compiled(kernel)
    values, options = compiled.arguments(args, kwargs)
    key = compiled.key(values, options)
    known = compiled.by_key.get(key)
    if known is not None:
        known[(*grid, 1, 1)[:3]](*values)  # CompiledKernel's launcher: every parameter, constexprs included, in order
        return
    result = kernel[grid](*args, **kwargs)  # compiles on a first call; returns the CompiledKernel
    if result is not None and len(compiled.by_key) < MAX_KEYS:
        compiled.by_key[key] = result
