"""bench/ncu.py: the ncu CSV parser on a hand-written sample, and the ncu subprocess path with a fake `ncu`."""

import stat
import sys
import textwrap

import pytest
import torch

from bench import ncu as ncu_mod
from bench.inputs import Shape

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
CHILD = ncu_mod.child_args("naive", Shape(1, 1, 64, 16, "float16", True), torch.device("cpu"))


def test_parse_ncu_csv_sums_kernels_and_units():
    totals, kernels_seen = ncu_mod.parse_ncu_csv(NCU_SAMPLE)
    assert kernels_seen == 2
    assert totals["dram__bytes_read.sum"] == pytest.approx(403.71e6 + 2.15e9)
    assert totals["dram__bytes_write.sum"] == pytest.approx(134_217_728 + 1_024_500)


def test_parse_ncu_csv_without_table_and_with_unknown_unit():
    assert ncu_mod.parse_ncu_csv("==PROF== ERR_NVGPUCTRPERM - no permission\n") == ({m: 0.0 for m in ncu_mod.NCU_METRICS}, 0)
    with pytest.raises(ValueError, match="furlong"):
        ncu_mod.parse_ncu_csv(NCU_SAMPLE.replace('"Gbyte"', '"furlong"'))


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
    read_gb, write_gb, n = ncu_mod.measure_hbm_ncu(ncu, CHILD)
    assert (n, read_gb, write_gb) == (2, pytest.approx(2.55371), pytest.approx(0.135242228))
    args = args_file.read_text().splitlines()
    for flag, value in (("--clock-control", "none"), ("--profile-from-start", "off"), ("--target-processes", "all"),
                        ("--metrics", "dram__bytes_read.sum,dram__bytes_write.sum")):
        assert args[args.index(flag) + 1] == value
    assert "--csv" in args and args[-len(CHILD) - 3:] == [sys.executable, "-m", "bench.ncu_child", *CHILD]


def test_measure_hbm_ncu_failure_falls_back(tmp_path, capsys):
    ncu = _fake_ncu(tmp_path, '''
        import sys
        print("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters")
        sys.exit(1)
        ''')
    assert ncu_mod.measure_hbm_ncu(ncu, CHILD) is None
    assert "ERR_NVGPUCTRPERM" in capsys.readouterr().out
