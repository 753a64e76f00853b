"""training/estimate.py and training/progress.py: the start-up step-time estimate and its warning,
and the progress lines of a long step."""

import logging
import time

import pytest
from conftest import compose_config

from training.config import validate_config
from training.estimate import SLOW_STEP_S, StepEstimate, causal_block_pairs, duration, estimate_step, slow_step_warning
from training.progress import StepProgress


def test_block_pairs_and_durations():
    assert [causal_block_pairs(n) for n in (1, 64, 65, 128, 1024)] == [1, 1, 3, 3, 136]  # nb(nb+1)/2, nb = ⌈N/64⌉
    assert [duration(s) for s in (0.04, 1.23, 42, 750, 47_000)] == ["0.0 s", "1.2 s", "42 s", "12 min", "13.1 h"]


@pytest.mark.slow
def test_the_default_run_on_a_cpu_warns_and_points_at_what_is_faster():
    """GPT-2 medium through the interpreter: hours per step, measured at start in seconds (most of
    it the interpreter's one-time set-up, which the first step would otherwise pay)."""
    import torch

    cfg = compose_config()
    validate_config(cfg)
    start = time.perf_counter()
    est = estimate_step(cfg, torch.float32)
    assert time.perf_counter() - start < 20  # the warning must come within seconds, not after step 1
    assert est.interpreter_s > 3600 and 0 < est.dense_s < est.interpreter_s, est
    text = slow_step_warning(cfg, est)
    assert "experiment=quickstart" in text and f"attention=sdpa (~{duration(est.dense_s)} per step)" in text
    assert "136 (query, key) tile pairs × 16 heads × 24 layers for each of 16 sequences" in text
    assert text.endswith("Running as asked.")  # a warning, not a refusal


def test_a_short_step_gets_no_warning_and_sdpa_no_interpreter_term():
    cfg = compose_config("attention=sdpa")
    assert slow_step_warning(cfg, StepEstimate(dense_s=SLOW_STEP_S - 1, interpreter_s=0.0)) is None
    text = slow_step_warning(cfg, StepEstimate(dense_s=2 * SLOW_STEP_S, interpreter_s=0.0))
    assert "experiment=quickstart" in text and "attention=sdpa" not in text and "interpreter" not in text


def test_a_long_step_announces_its_phases_and_a_heartbeat_says_where_it_is(caplog):
    with caplog.at_level(logging.INFO), StepProgress(expected_s=120, first_every_s=0.1) as progress:
        progress.begin(1, announce=True)
        progress.phase("micro-batch 1/2 forward")
        time.sleep(0.5)
        progress.phase("micro-batch 1/2 backward")
        progress.end()
        time.sleep(0.3)  # between steps: no heartbeat
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "step 1: micro-batch 1/2 forward (estimated ~2 min per step)"
    assert any(line.startswith("step 1: still running (micro-batch 1/2 forward), ") and line.endswith(" of ~2 min estimated")
               for line in lines), lines
    assert lines[-1].startswith("step 1: micro-batch 1/2 backward (0.") and lines[-1].endswith(" s into the step)")
    beats = [line for line in lines if "still running" in line]
    assert 1 <= len(beats) <= 3, beats  # intervals double: 0.1, 0.2, 0.4 s


def test_steps_that_are_not_announced_stay_quiet(caplog):
    with caplog.at_level(logging.INFO), StepProgress(expected_s=None, first_every_s=30) as progress:
        progress.begin(2)
        progress.phase("micro-batch 1/1 forward")
        progress.end()
    assert caplog.records == []


@pytest.mark.parametrize("n_layer", [1])
def test_estimate_leaves_the_global_rng_alone(n_layer):
    import torch

    cfg = compose_config("model=tiny", f"model.n_layer={n_layer}", "seq_len=64", "batch_size=2", "attention=sdpa")
    validate_config(cfg)
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    estimate_step(cfg, torch.float32)
    assert torch.equal(torch.rand(3), expected)  # the run seeds later, and a resume restores the RNG exactly
