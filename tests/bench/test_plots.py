"""bench/plots.py: the attention-sweep figures (with an OOM frontier and memory n/a) and the training-sweep figure."""

from bench import plots


def _row(**over):
    row = dict(impl="flash", dtype="bfloat16", head_dim=64, seqlen=1024, batch=16, heads=16, causal=False,
               fwd_ms=None, bwd_ms=None, fwdbwd_ms=None, fwd_tflops=None, bwd_tflops=None, fwdbwd_tflops=None,
               peak_mem_mib=None, status="ok")
    return {**row, **over}


def test_attention_plots_written_with_oom_frontier(tmp_path):
    rows = []
    for causal in (False, True):
        for impl in ("naive", "flash", "mine"):
            for n in (512, 1024, 2048, 4096):
                oom = impl == "naive" and n >= 2048
                b = 16384 // n
                rows.append(_row(impl=impl, seqlen=n, batch=b, causal=causal, status="oom" if oom else "ok",
                                 fwdbwd_ms=None if oom else n / 100, fwdbwd_tflops=None if oom else 100.0,
                                 peak_mem_mib=None if oom else b * n * (n if impl == "naive" else 64) / 2**20))
    rows.append(_row(impl="flash", seqlen=8192, batch=2, fwdbwd_ms=1.0, status="ok"))  # memory n/a (as on CPU)
    paths = plots.plot_attention_sweep(rows, tmp_path / "plots")
    assert [p.name for p in paths] == list(plots.ATTENTION_PLOTS)
    assert all(p.stat().st_size > 10_000 for p in paths)


def test_train_sweep_plot_with_an_oom(tmp_path):
    rows = [dict(model="gpt2", attention=a, seq_len=n, tokens_per_s=None if oom else 1e5 / n * 1024,
                 peak_mem_gib=None if oom else n / 1024, status="oom" if oom else "ok", run_dir=str(tmp_path))
            for a in ("naive", "flash") for n in (1024, 2048) for oom in [a == "naive" and n == 2048]]
    path = plots.plot_train_sweep(rows, tmp_path / "sub" / "sweep.png")
    assert path.stat().st_size > 10_000
