"""scripts/paper_table.py on CPU: FLOP counts (analytic vs FlopCounterMode), the analytic HBM model,
the ncu CSV parser on a hand-written sample, the ncu subprocess path with a fake `ncu`, and a smoke run."""

import stat
import sys
import textwrap

import pytest
import torch

import kernels  # noqa: F401 - first, so the Triton backend is chosen before anything imports triton
from scripts import paper_table as pt
from scripts._common import read_results
from scripts._impls import make_impl

CPU = torch.device("cpu")
PAPER = pt.Shape(batch=64, heads=16, seqlen=1024, head_dim=64, dtype="float16", causal=True)

# What `ncu --csv` prints: its own ==PROF== lines, then one row per (kernel, metric). Values may be
# scaled (Kbyte, Mbyte, ...) and carry thousands separators; kernel names may contain commas.
NCU_SAMPLE = textwrap.dedent('''\
    ==PROF== Connected to process 4242 (/usr/bin/python3.11)
    ==PROF== Profiling "_fwd_kernel" - 0: 0%....50%....100% - 1 pass
    ==PROF== Profiling "void at::native::elementwise_kernel<128, 2>(int, T3)" - 1: 0%....50%....100% - 1 pass
    ==PROF== Disconnected from process 4242
    "ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
    "0","4242","python3.11","127.0.0.1","_fwd_kernel","1","7","(128, 1, 1)","(8, 1024, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","Mbyte","403.71"
    "0","4242","python3.11","127.0.0.1","_fwd_kernel","1","7","(128, 1, 1)","(8, 1024, 1)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","byte","134,217,728"
    "0","4242","python3.11","127.0.0.1","_fwd_kernel","1","7","(128, 1, 1)","(8, 1024, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","812.35"
    "1","4242","python3.11","127.0.0.1","void at::native::elementwise_kernel<128, 2>(int, T3)","1","7","(128, 1, 1)","(4096, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","Gbyte","2.15"
    "1","4242","python3.11","127.0.0.1","void at::native::elementwise_kernel<128, 2>(int, T3)","1","7","(128, 1, 1)","(4096, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","Kbyte","1,024.5"
    ''')


def test_parse_ncu_csv_sums_kernels_and_units():
    totals, kernels_seen = pt.parse_ncu_csv(NCU_SAMPLE)
    assert kernels_seen == 2
    assert totals["dram__bytes_read.sum"] == pytest.approx(403.71e6 + 2.15e9)
    assert totals["dram__bytes_write.sum"] == pytest.approx(134_217_728 + 1_024_500)


def test_parse_ncu_csv_without_table_and_with_unknown_unit():
    assert pt.parse_ncu_csv("==PROF== ERR_NVGPUCTRPERM - no permission\n") == ({m: 0.0 for m in pt.NCU_METRICS}, 0)
    with pytest.raises(ValueError, match="furlong"):
        pt.parse_ncu_csv(NCU_SAMPLE.replace('"Gbyte"', '"furlong"'))


def _fake_ncu(tmp_path, body: str):
    path = tmp_path / "ncu"
    path.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_measure_hbm_ncu_with_a_fake_ncu(tmp_path):
    # The fake checks the flags the measurement depends on and writes the sample where --log-file says.
    args_file = tmp_path / "args.txt"
    ncu = _fake_ncu(tmp_path, f'''
        import sys
        args = sys.argv[1:]
        open({str(args_file)!r}, "w").write("\\n".join(args))
        open(args[args.index("--log-file") + 1], "w").write({NCU_SAMPLE!r})
        ''')
    read_gb, write_gb, n = pt.measure_hbm_ncu(ncu, ["--ncu-child", "naive"])
    assert (n, read_gb, write_gb) == (2, pytest.approx(2.55371), pytest.approx(0.135242228))
    args = args_file.read_text().splitlines()
    for flag, value in (("--clock-control", "none"), ("--profile-from-start", "off"), ("--target-processes", "all"),
                        ("--metrics", "dram__bytes_read.sum,dram__bytes_write.sum")):
        assert args[args.index(flag) + 1] == value
    assert "--csv" in args and args[-2:] == ["--ncu-child", "naive"] and str(pt.SCRIPT) in args


def test_measure_hbm_ncu_failure_falls_back(tmp_path, capsys):
    ncu = _fake_ncu(tmp_path, '''
        import sys
        print("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters")
        sys.exit(1)
        ''')
    assert pt.measure_hbm_ncu(ncu, ["--ncu-child", "naive"]) is None
    assert "ERR_NVGPUCTRPERM" in capsys.readouterr().out


def test_analytic_flops_recompute_vs_stored_p():
    n, d, bh = 1024, 64, 64 * 16
    fwd, bwd = pt.analytic_gflops("flash", PAPER)
    assert fwd == pytest.approx(4 * d * n * (n + 1) / 2 * bh / 1e9) and bwd == pytest.approx(2.5 * fwd)
    nfwd, nbwd = pt.analytic_gflops("naive", PAPER)  # the full square, masked after the matmul; P kept
    assert nfwd == pytest.approx(4 * d * n * n * bh / 1e9) and nbwd == pytest.approx(2 * nfwd)


@pytest.mark.parametrize("impl", ["naive", "flash", "flash_fused"])
@pytest.mark.parametrize("causal", [False, True])
def test_flop_counter_agrees_with_analytic(impl, causal):
    shape = pt.Shape(batch=1, heads=2, seqlen=40, head_dim=16, dtype="float32", causal=causal)
    counted = pt.counted_gflops(make_impl(impl), shape, CPU)
    assert counted == pytest.approx(pt.analytic_gflops(impl, shape), rel=1e-9)


def test_analytic_hbm_model_against_the_measured_anchors():
    # DESIGN.md anchors, ncu on an H200 at this shape: naive 41.2 GB; compulsory traffic about 1.6 GB.
    read, write = pt.naive_hbm_bytes(PAPER)
    assert (read + write) / 1e9 == pytest.approx(41.2, rel=0.1)
    nd = 64 * 16 * 1024 * 64 * 2
    for impl in ("flash", "sdpa"):
        read, write = pt.fused_hbm_bytes(PAPER, impl)
        assert 12 * nd <= read + write <= 20 * nd
    non_causal = pt.naive_hbm_bytes(pt.Shape(64, 16, 1024, 64, "float16", causal=False))
    assert sum(non_causal) < sum(pt.naive_hbm_bytes(PAPER))  # no masking passes


def test_forward_hbm_model_falls_with_block_m():
    small, large = pt.forward_hbm_bytes(PAPER, 32), pt.forward_hbm_bytes(PAPER, 128)
    assert small[0] > large[0] and small[1] == large[1]


def test_markdown_sits_beside_the_paper():
    rows = [
        dict(impl="naive", gflops_fwd=137.4, gflops_bwd=274.9, gflops_fwd_counted=137.4, gflops_bwd_counted=274.9,
             hbm_read_gb=25.0, hbm_write_gb=16.0, hbm_source="ncu", runtime_ms=10.0, status="ok"),
        dict(impl="flash", gflops_fwd=68.8, gflops_bwd=172.0, gflops_fwd_counted=68.8, gflops_bwd_counted=172.0,
             hbm_read_gb=2.0, hbm_write_gb=1.0, hbm_source="ncu", runtime_ms=2.0, status="ok"),
    ]
    meta = dict(gpu="NVIDIA H200", torch="2.11", triton="3.6", cuda="13.0", date="today", git_rev="abc")
    text = pt.markdown(meta, PAPER, rows, [])
    for expected in ("66.6", "75.2", "40.3", "4.4", "41.7", "7.3", "flash (ours)", "NVIDIA H200",
                     "HBM traffic naive / ours = 13.7x (ncu)", "runtime naive / ours = 5.0x"):
        assert expected in text


def test_main_smoke_on_cpu(tmp_path):
    out = tmp_path / "pt.json"
    result = pt.main(["--device", "cpu", "--batch", "1", "--heads", "1", "--seqlen", "64", "--head-dim", "16",
                      "--impls", "naive", "sdpa_math", "--block-n", "32", "--rep-ms", "1", "--warmup-ms", "1", "--out", str(out)])
    data = read_results(out)
    assert data["rows"] == result["rows"] and {"gpu", "torch", "triton", "cuda", "date", "git_rev"} <= set(data["meta"])
    assert [r["impl"] for r in data["rows"]] == ["naive", "sdpa_math"]
    for row in data["rows"]:
        assert set(pt.ROW_KEYS) == set(row) and row["status"] == "ok" and row["hbm_source"] == "analytic"
        assert row["runtime_ms"] > 0 and row["gflops_fwd_counted"] == pytest.approx(row["gflops_fwd"], rel=1e-3)
    [block] = data["block_study"]
    assert block["block_n"] == 32 and block["status"] == "ok" and block["fwd_ms"] > 0
    assert block["max_abs_diff_vs_default"] < 1e-2  # forcing tiles must not change the result
    assert "paper A100" in out.with_suffix(".md").read_text()


def test_ncu_child_runs_one_pass_on_cpu():
    # The child's plumbing (shape flags, forced tiles); under ncu on a GPU it brackets the pass
    # with cudaProfilerStart/Stop.
    pt.main(["--ncu-child", "flash", "--child-pass", "fwd", "--child-block-n", "32", "--device", "cpu",
             *pt.Shape(1, 1, 64, 16, "float16", True).cli()])
