"""kernels/flash_attn/fast_launch.py on CPU, with a stand-in for a Triton kernel: which calls go
through Triton's binding and which reuse the compiled kernel (the GPU tests run the real one)."""
import inspect

import pytest
import torch

from kernels.flash_attn import fast_launch


class FakeCompiled:
    def __init__(self, log):
        self.log = log

    def __getitem__(self, grid):
        return lambda *values: self.log.append(("compiled", grid, values))


class FakeKernel:
    """What launch reads of a JITFunction: arg_names, params' defaults, pre_run_hooks, kernel[grid](...)."""

    def __init__(self):
        def signature(x, n, scale, BLOCK, FLAG=False):
            pass
        self.arg_names = list(inspect.signature(signature).parameters)
        self.params = [type("P", (), {"default": p.default})() for p in inspect.signature(signature).parameters.values()]
        self.pre_run_hooks = []
        self.log = []

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.log.append(("triton", grid, args, kwargs))
            return FakeCompiled(self.log)
        return run


@pytest.fixture
def kernel(monkeypatch):
    monkeypatch.setattr(fast_launch, "supported", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)  # the CPU suite has no CUDA device to ask
    k = FakeKernel()
    yield k
    fast_launch._COMPILED.pop((k, 0), None)


def paths(k):
    return [entry[0] for entry in k.log]


def test_a_repeated_key_reuses_the_compiled_kernel_with_every_argument_in_order(kernel):
    x = torch.zeros(8)
    fast_launch.launch(kernel, (4, 2), x, 16, 0.5, BLOCK=64, num_warps=4)
    fast_launch.launch(kernel, (4, 2), x, 16, 0.25, BLOCK=64, num_warps=4)  # another float: same key
    assert paths(kernel) == ["triton", "compiled"]
    assert kernel.log[1][1] == (4, 2, 1)  # the compiled launcher takes a 3-D grid
    assert kernel.log[1][2] == (x, 16, 0.25, 64, False)  # the default filled in, the option left out


def test_keywords_in_any_order_land_in_signature_order(kernel):
    x = torch.zeros(8)
    for flag in (True, True, False):  # the second call reuses the first's plan and kernel
        fast_launch.launch(kernel, (1,), x, 16, 0.5, FLAG=flag, num_warps=4, BLOCK=64)
    assert paths(kernel) == ["triton", "compiled", "triton"]
    assert kernel.log[1][2] == (x, 16, 0.5, 64, True)


@pytest.mark.parametrize("change", ["int", "dtype", "alignment", "constexpr", "option", "bool_for_int"])
def test_what_triton_specialises_on_makes_a_new_key(kernel, change):
    x = torch.zeros(64)
    base = dict(args=(x, 1, 0.5), kwargs=dict(BLOCK=64, num_warps=4))
    other = {"int": dict(args=(x, 17, 0.5)), "dtype": dict(args=(x.half(), 1, 0.5)),
             "alignment": dict(args=(x[1:], 1, 0.5)), "constexpr": dict(kwargs=dict(BLOCK=128, num_warps=4)),
             "option": dict(kwargs=dict(BLOCK=64, num_warps=8)), "bool_for_int": dict(args=(x, True, 0.5))}[change]
    call = {**base, **other}
    fast_launch.launch(kernel, (1,), *base["args"], **base["kwargs"])
    fast_launch.launch(kernel, (1,), *call["args"], **call["kwargs"])
    assert paths(kernel) == ["triton", "triton"]


def test_switched_off_every_call_goes_through_triton_until_switched_on(kernel, monkeypatch):
    monkeypatch.setattr(fast_launch, "_SWITCHED_ON", True)  # restored after the test
    fast_launch.set_enabled(False)
    for _ in range(2):
        fast_launch.launch(kernel, (1,), torch.zeros(4), 1, 1.0, BLOCK=16)
    fast_launch.set_enabled(True)
    for _ in range(2):
        fast_launch.launch(kernel, (1,), torch.zeros(4), 1, 1.0, BLOCK=16)
    assert paths(kernel) == ["triton", "triton", "triton", "compiled"]


def test_unsupported_means_every_call_goes_through_triton(kernel, monkeypatch):
    monkeypatch.setattr(fast_launch, "supported", lambda: False)
    for _ in range(2):
        fast_launch.launch(kernel, (1,), torch.zeros(4), 1, 1.0, BLOCK=16)
    assert paths(kernel) == ["triton", "triton"]


def test_the_cache_stops_growing(kernel, monkeypatch):
    monkeypatch.setattr(fast_launch, "MAX_KEYS", 2)
    for n in (1, 2, 3, 3):
        fast_launch.launch(kernel, (1,), torch.zeros(4), n, 1.0, BLOCK=16)
    assert paths(kernel) == ["triton", "triton", "triton", "triton"]  # n=3 was never kept


def test_off_in_the_interpreter():
    from kernels.flash_attn.launch import interpreting

    if not interpreting():
        pytest.skip("the CPU suite runs the interpreter; on a GPU the GPU tests cover the reuse")
    assert not fast_launch.supported() and not fast_launch.enabled()
