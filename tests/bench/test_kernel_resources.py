"""scripts/kernel_resources.py: our kernels compiled for an sm_90 target on a machine without a GPU.
Its own process: it needs Triton with the interpreter off, which this test process has on."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_compiles_the_table_config_and_reads_registers_and_shared_memory(tmp_path):
    out = tmp_path / "resources.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "kernel_resources.py"), "--kernels", "fwd", "--head-dims", "64",
                          "--documents", "both", "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["kernel"], r["documents"]) for r in rows] == [("fwd", False), ("fwd", True)]
    for r in rows:
        assert r["tile"] == "128x64x8x3" and 0 < r["regs"] <= 255 and r["spill_bytes"] >= 0 and r["shared_bytes"] > 0
