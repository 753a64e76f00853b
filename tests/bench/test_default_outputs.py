"""Every script, run as users run it (`python scripts/NAME.py ...`, a fresh process), writes its
default outputs under outputs/bench/<date>/<script>/ of the folder it runs in, and nothing into the
repository (no docs/ result rewritten, no file dropped in the repo root). paper_table and tune_flash
need kernels.flash_attn.launch."""

import os
import subprocess
import sys
from datetime import date
from pathlib import Path

import pytest
from _fake_runs import OK, fake_run

REPO = Path(__file__).resolve().parents[2]
QUICK = ["--device", "cpu", "--quick"]
SCRIPTS = {
    # script: (arguments, files expected in its output folder)
    "bench_attention": ([*QUICK, "--impls", "naive", "--seqlens", "16", "--causal", "false"],
                        {"attention_bench.json", "attention_time.png", "attention_memory.png", "attention_tflops.png"}),
    "paper_table": ([*QUICK, "--impls", "naive", "--block-n", "32"], {"paper_table.json", "paper_table.md"}),
    "profile_backward": ([*QUICK, "--impls", "naive", "--causal", "false"], {"backward_profile.json", "backward_profile.md"}),
    "tune_flash": (["--device", "cpu", "--seqlen", "32", "--tokens", "32", "--heads", "1", "--head-dims", "16", "--causal", "false",
                    "--kernels"], {"tune_flash.json"}),
    "compare_runs": (["runs"], {"train_sweep.json", "train_sweep.png"}),
    "scaling": (["report", "runs"], {"scaling.json"}),
    "kernel_resources": (["--kernels", "fwd", "--head-dims", "64"], {"kernel_resources.json"}),
}


def repo_state() -> tuple[str, list[str]]:
    """What a write into the tree would change: git's view (modified and untracked files) and the
    repo's own outputs/bench (git-ignored, so git cannot see it)."""
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout
    outputs = REPO / "outputs" / "bench"
    return status, sorted(str(p) for p in outputs.rglob("*")) if outputs.exists() else []


@pytest.mark.slow
@pytest.mark.parametrize("script", list(SCRIPTS))
def test_default_outputs_stay_out_of_the_repository(script, tmp_path):
    args, expected = SCRIPTS[script]
    fake_run(tmp_path / "runs", "flash-1gpu", "flash", 1024, OK, parallel="ddp", batch_size=2)
    before = repo_state()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / f"{script}.py"), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out_dir = tmp_path / "outputs" / "bench" / date.today().isoformat() / script
    assert expected <= {p.name for p in out_dir.iterdir()}
    assert repo_state() == before
