"""training/setup.py: the model a config builds, and a run's derived numbers."""

import pytest
import torch
from _tiny import CPU
from conftest import SHRINK, compose_config
from omegaconf import OmegaConf

from model.flops import datasheet_peak
from training.config import ConfigError
from training.setup import build_model, cached_value, peak_flops, setup

SYNTHETIC = [*SHRINK, "attention=sdpa", "batch_size=8", "grad_accum=2", "data=synthetic", "data.vocab_size=100",
             "data.num_tokens=5000"]


def test_build_model_pads_a_null_vocab_and_refuses_a_small_one(tiny_cfg):
    model = build_model(tiny_cfg(), tokenizer_vocab=4000, device=CPU)
    assert model.cfg.vocab_size == 4032 and model.cfg.seq_len == 32
    with pytest.raises(ConfigError, match="model.vocab_size=64 is smaller than the tokenizer's 4000"):
        build_model(tiny_cfg("model.vocab_size=64"), tokenizer_vocab=4000, device=CPU)


def test_plain_runs_are_untouched_by_the_distributed_paths(tmp_path):
    """Without torchrun: no process group, the model unwrapped, rank 0 of 1 in the summary's derived numbers."""
    cfg = compose_config(*SYNTHETIC, "steps=1", f"out_dir={tmp_path / 'run'}", f"cache_dir={tmp_path / 'cache'}")
    run = setup(cfg)
    assert not torch.distributed.is_initialized() and run.model is run.raw_model
    assert run.derived["ranks"] == 1 and run.derived["parallel"] == "none" and run.derived["micro_batch"] == 4
    assert OmegaConf.select(cfg, "parallel") == "ddp"


def test_peak_flops_comes_from_config_else_none_on_cpu(tiny_cfg):
    assert peak_flops(tiny_cfg("peak_tflops=2.5"), CPU, torch.float32) == (2.5e12, "config peak_tflops")
    peak, source = peak_flops(tiny_cfg(), CPU, torch.float32)
    assert peak is None and "CPU" in source  # no MFU against a made-up CPU peak


def test_datasheet_peaks_name_the_gpu_and_only_16bit():
    assert datasheet_peak("NVIDIA H200", torch.bfloat16) == 989.4e12
    assert datasheet_peak("NVIDIA H100 PCIe", torch.float16) == 756.0e12  # not the SXM figure
    assert datasheet_peak("NVIDIA H200 NVL", torch.bfloat16) == 835.0e12
    assert datasheet_peak("NVIDIA A100-SXM4-80GB", torch.bfloat16) == 312.0e12
    assert datasheet_peak("NVIDIA H200", torch.float32) is None  # TF32 or not: no single figure
    assert datasheet_peak("Some Future GPU", torch.bfloat16) is None


def test_a_measured_peak_is_measured_once_per_machine_and_shared(tmp_path):
    calls = []

    def measure():
        calls.append(1)
        return 123.0e12 + len(calls)  # a second measurement would differ, as real ones do

    path = tmp_path / "cache" / "peak_flops.json"
    first = cached_value(path, "GPU X bfloat16", measure)
    assert cached_value(path, "GPU X bfloat16", measure) == first and len(calls) == 1
    assert cached_value(path, "GPU X float16", measure) != first and len(calls) == 2  # per dtype
