"""bench/cli.py: dtype names, the --quick defaults, the device."""

import argparse

import pytest
import torch

from bench.cli import dtype_name, fill_defaults, parse_dtype, resolve_device


def test_parse_dtype_and_name():
    assert parse_dtype("bf16") is torch.bfloat16 and parse_dtype("float16") is torch.float16
    assert dtype_name(torch.bfloat16) == "bfloat16" and dtype_name(torch.float16) == "float16"
    with pytest.raises(ValueError, match="bfloat16"):
        parse_dtype("fp8")


def test_fill_defaults_explicit_flags_win_and_dtypes_are_normalised(capsys):
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int)
    parser.add_argument("--dtypes", nargs="+")
    parser.add_argument("--quick", action="store_true")
    defaults, quick = dict(n=100, dtypes=["bf16"]), dict(n=2, dtypes=["fp16"])
    args = fill_defaults(parser, parser.parse_args(["--quick", "--dtypes", "half"]), defaults, quick, ["dtypes"])
    assert (args.n, args.dtypes) == (2, ["float16"])
    assert fill_defaults(parser, parser.parse_args([]), defaults, quick, ["dtypes"]).n == 100
    with pytest.raises(SystemExit):
        fill_defaults(parser, parser.parse_args(["--dtypes", "fp8"]), defaults, quick, ["dtypes"])
    assert "fp8" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
def test_cuda_without_a_gpu_is_an_error_not_a_fallback():
    assert resolve_device(None).type == "cpu"
    with pytest.raises(SystemExit, match="--device cpu"):
        resolve_device("cuda")
