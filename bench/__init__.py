"""Measuring attention and training runs: the code behind scripts/*.py.

    cli       dtype names, devices, --quick defaults
    results   run metadata (GPU, versions, date, git rev), result JSON, default output folders
    timing    median times (triton.testing.do_bench) and peak memory
    failures  a sweep point that fails (OOM, unsupported) is recorded and the sweep goes on
    inputs    attention shapes, random inputs, the timed forward / forward+backward calls
    impls     the attention implementations compared, by name
    sweep     one row per (impl, dtype, head_dim, seqlen, causal) point: times, TFLOP/s, memory
    flops     the paper table's FLOP counts (analytic and FlopCounterMode)
    hbm       the analytic HBM-traffic model
    ncu       Nsight Compute: the command, its CSV, the bytes it counted
    ncu_child the one pass ncu profiles (`python -m bench.ncu_child`)
    tiles     our kernels at forced launch configs (tuning, block-size study)
    runs      rows of training-run folders (compare_runs.py, scaling.py)
    tables    console and markdown tables (tabulate)
    plots     the figures
"""

import kernels  # noqa: F401  picks the Triton backend (CPU interpreter without CUDA) before anything here imports triton
