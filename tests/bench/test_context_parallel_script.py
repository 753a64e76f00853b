"""scripts/context_parallel.py and bench/comm_overlap.py: the commands it launches, the rows,
efficiency and frontier of hand-made runs, and the ring's hidden share in a hand-made trace."""

import json

import pytest
from _fake_runs import OK, fake_run

from bench.comm_overlap import ring_overlap
from bench.results import read_results
from scripts import context_parallel as script


def kernel(name, ts, dur):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur}


def test_ring_overlap_counts_ring_kernels_beside_compute_and_leaves_out_gradient_reductions():
    trace = {"traceEvents": [
        kernel("flash_fwd", 0, 100), kernel("gemm", 150, 50),  # compute: [0, 100) and [150, 200)
        kernel("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", 50, 100),  # 50 hidden, 50 exposed
        kernel("ncclDevKernel_SendRecv(...)", 60, 20),  # inside the first: counted once
        kernel("ncclDevKernel_AllGather_RING_LL(...)", 160, 20),  # PyTorch's K/V rotation: hidden
        kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(...)", 300, 400),  # DDP's gradients: not the ring
        {"ph": "X", "cat": "cpu_op", "name": "nccl:send", "ts": 0, "dur": 999},  # host side: not a kernel
    ]}
    got = ring_overlap(trace, steps=2)
    assert got == {"ring_comm_ms": pytest.approx(0.06), "ring_exposed_ms": pytest.approx(0.025),
                   "comm_hidden_share": pytest.approx(70 / 120)}
    no_ring = ring_overlap({"traceEvents": [kernel("gemm", 0, 10)]}, steps=1)
    assert no_ring == {"ring_comm_ms": None, "ring_exposed_ms": None, "comm_hidden_share": None}


def test_dry_run_prints_one_command_per_rung(capsys, tmp_path):
    args = ["--attention", "flash", "--seq-lens", "4096", "8192", "--runs-dir", str(tmp_path), "--dry-run",
            "--train", "compile=false"]
    assert script.main(args) is None
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("===")]
    assert [line.split(":")[0] for line in lines] == [f"=== flash-cp{cp}-n{n}" for cp in (1, 2) for n in (4096, 8192)]
    assert "torch.distributed.run --standalone --nproc_per_node=2" in lines[2] and "context_parallel=2" in lines[2]
    assert "torch.distributed.run" not in lines[0] and lines[0].endswith("compile=false")
    assert "experiment=long-context " in lines[0] and "seq_len=4096 batch_size=1" in lines[0]
    assert not any(tmp_path.iterdir())
    script.main(["--attention", "sdpa", "--dp", "2", "--cp", "2", "--seq-lens", "8192", "--runs-dir", str(tmp_path), "--dry-run"])
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("==="))
    assert line.startswith("=== sdpa-dp2-cp2-n8192:") and "--nproc_per_node=4" in line
    assert "batch_size=2" in line and "context_parallel=2" in line


def test_report_rows_efficiency_and_frontier(tmp_path):
    def run(attention, cp, seq_len, tokens_per_s=None, status="ok", dp=1):
        summary = {**OK, "status": status, "final/tokens_per_s_median": tokens_per_s, "ranks": dp * cp}
        fake_run(tmp_path, script.run_name(attention, dp, cp, seq_len), attention, seq_len, summary,
                 context_parallel=cp, batch_size=dp)

    run("flash", 1, 8192, 100_000.0)
    run("flash", 1, 16384, 80_000.0, status="oom")
    run("flash", 2, 16384, 180_000.0)
    run("flash", 2, 32768, 120_000.0)  # no one-GPU run at 16384 that trained: no efficiency
    run("flash", 2, 16384, 340_000.0, dp=2)  # 4 GPUs, two sequences of 16384 per step, each over 2 GPUs
    (tmp_path / "flash-cp2-n16384" / "trace.json").write_text(json.dumps({"traceEvents": [
        kernel("gemm", 0, 300), kernel("ncclDevKernel_SendRecv", 200, 300)]}))
    out = tmp_path / "cp.json"
    rows = script.main(["--report-only", "--runs-dir", str(tmp_path), "--out", str(out)])
    by = {(r["cp"], r["seq_len"]): r for r in rows if r["dp"] == 1}
    both = next(r for r in rows if r["dp"] == 2)
    assert both["gpus"] == 4 and both["tokens_per_s_per_gpu"] == 85_000 and both["efficiency"] == 0.85
    assert by[2, 16384]["tokens_per_s_per_gpu"] == 90_000 and by[2, 16384]["efficiency"] == 0.9
    assert by[2, 16384]["gpus"] == 2 and by[2, 16384]["comm_hidden_share"] == pytest.approx(1 / 3, rel=1e-3)
    assert by[2, 32768]["efficiency"] is None and by[1, 16384]["status"] == "oom"
    saved = read_results(out)
    assert saved["frontier"] == {"flash": {"cp1": 8192, "cp2": 32768, "dp2xcp2": 16384}}
    assert {"attention", "gpus", "cp", "seq_len", "status", "tokens_per_s", "tokens_per_s_per_gpu", "peak_mem_gib",
            "efficiency"} <= saved["rows"][0].keys() and saved["meta"]["git_rev"]
