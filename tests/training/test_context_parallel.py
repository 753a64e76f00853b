"""training/context_parallel.py: `context_parallel=N` runs of train.py (gloo ranks through torchrun's
agent, our kernel in the interpreter; launches marked slow) reach the one-process run's losses,
resume across CP degrees both ways, and the config rules refuse what cannot run."""

import pytest
import torch
from conftest import SHRINK, PatternDataset, compose_config
from test_distributed import RUN, launch, single, steps

from model import GPT, GPTConfig
from training import train
from training.batches import micro_batches
from training.checkpoint import CHECKPOINT_NAME, load_checkpoint
from training.config import ConfigError, validate_config
from training.distributed import DistInfo

# One sequence of 16 tokens per step, one head: each of 2 CP ranks holds 8 tokens (zigzag chunks of 4).
# Our kernel runs in the interpreter (~ms per program and ring step): flash's single-pass backward,
# one kernel per ring step instead of two.
SMALL = ["model.n_head=1", "batch_size=1", "grad_accum=1", "seq_len=16", "steps=10", "eval_every=0", "eval_steps=1"]
CP_RUN = [*SMALL, "attention=flash", "attention.deterministic=false", "context_parallel=2"]
ONE = [*SMALL, "attention=sdpa"]  # the one-process run: the same function of the same weights, fast on the CPU


def assert_same_losses(a, b) -> None:
    """Train losses of all 10 steps and the validation losses both runs have, to 4 decimals (our ring
    and one SDPA call round differently: differences of ~1e-7, which Adam grows over the steps; a
    token at a wrong position, a lost rank's gradient or a missed key changes the 2nd-3rd decimal)."""
    sa, sb = steps(a), steps(b)
    assert [s for s, _, _ in sa] == [s for s, _, _ in sb] == list(range(1, 11))
    for (step, la, va), (_, lb, vb) in zip(sa, sb):
        assert abs(la - lb) < 1e-4, (step, la, lb)
        assert va is None or vb is None or abs(va - vb) < 1e-4, (step, va, vb)
    assert sa[-1][2] is not None and sb[-1][2] is not None  # both evaluated at the end


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The reference: 10 steps in one process, no context parallelism."""
    return single(tmp_path_factory.mktemp("straight"), *ONE)


@pytest.mark.slow
def test_two_cp_ranks_match_one_process_which_resumes_their_checkpoint(tmp_path, straight):
    two = launch(tmp_path, 2, *CP_RUN, "ckpt_every=5", "stop_at=5")
    log = (two / "train.log").read_text()
    assert "(1 sequence per micro-step on each of 2 ranks, ddp, context_parallel=2: 8 tokens of each per rank)" in log
    # the checkpoint is full-state, as a single process writes it: one process continues the run
    saved = load_checkpoint(two / CHECKPOINT_NAME)
    assert saved["step"] == 5 and saved["model"]["wpe.weight"].shape[0] == 16
    train(compose_config(*RUN, *ONE, "ckpt_every=5", "resume=true", f"out_dir={two}"))
    assert_same_losses(two, straight)


@pytest.mark.slow
def test_two_data_parallel_groups_of_two_cp_ranks_match_one_process(tmp_path):
    # world 4 = dp 2 × cp 2: two sequences per step, each split over a pair of ranks; the gradients
    # average over the data-parallel groups as one process's over its batch of 2
    four = launch(tmp_path, 4, *CP_RUN, "batch_size=2")
    assert "on each of 4 ranks, ddp, context_parallel=2" in (four / "train.log").read_text()
    assert_same_losses(four, single(tmp_path / "one", *ONE, "batch_size=2"))


@pytest.mark.slow
def test_one_process_checkpoint_resumes_on_two_cp_ranks_under_fsdp(tmp_path, straight):
    one = single(tmp_path, *ONE, "ckpt_every=5", "stop_at=5")
    launch(tmp_path, 2, *CP_RUN, "parallel=fsdp", "ckpt_every=5", "resume=true", run_dir=one)
    assert "on each of 2 ranks, fsdp, context_parallel=2" in (one / "train.log").read_text()
    assert_same_losses(one, straight)


@pytest.mark.parametrize(
    "overrides, world, message",
    [
        (["seq_len=14"], 2, r"seq_len=14 must be divisible by 2 × context_parallel = 4: .*chunks r and 3-r"),
        (["seq_len=18"], 2, r"seq_len=18 must be divisible by 2 × context_parallel = 4: .*e\.g\. seq_len=20"),
        (["attention=naive"], 2, r"attention=naive cannot run with context_parallel=2: .*attention=flash"),
        (["attention=sdpa"], 2, r"attention=sdpa with context_parallel=2 needs CUDA"),
        ([], 3, r"context_parallel=2 must divide the number of ranks \(3\)"),
        ([], 1, r"context_parallel=2 must divide the number of ranks \(1\): .*torchrun"),
        (["batch_size=3"], 4, r"batch_size=3 must be divisible by ranks / context_parallel × grad_accum = 2 × 1"),
    ],
    ids=["seq-len", "seq-len-suggests", "naive", "sdpa-cpu", "world", "no-torchrun", "batch"],
)
def test_context_parallel_config_is_refused_with_the_rule(overrides, world, message):
    cfg = compose_config(*SHRINK, "attention=flash", "context_parallel=2", "seq_len=16", "batch_size=4", *overrides)
    with pytest.raises(ConfigError, match=message):
        validate_config(cfg, world_size=world)


def test_context_parallel_config_that_runs():
    validate_config(compose_config(*SHRINK, "attention=flash", "context_parallel=2", "seq_len=16", "batch_size=2"), 4)
    validate_config(compose_config(*SHRINK, "attention=naive", "context_parallel=1"), 1)  # the default: nothing to check


def test_positions_are_each_tokens_place_in_the_whole_sequence():
    """Without blocks every token's logits depend on its id and position alone: a rank's tokens with
    their global positions give the whole sequence's logits at those places, positions (N,) or (B, N)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(0, 2, 16, 32, 8))
    idx = torch.randint(32, (2, 8))
    whole, _ = model(idx)
    assert torch.equal(model(idx, positions=torch.arange(8))[0], whole)
    picked = torch.tensor([1, 2, 5, 6])  # a CP rank's tokens (zigzag, cp=2, chunks of 2)
    assert not torch.allclose(model(idx[:, picked])[0], whole[:, picked])  # read as positions 0..3
    for positions in (picked, picked.expand(2, 4)):
        assert torch.equal(model(idx[:, picked], positions=positions)[0], whole[:, picked])


def test_a_context_parallel_group_reads_the_same_rows_and_data_parallel_groups_split_them():
    """world 4 = dp 2 × cp 2: ranks 0, 1 (group 0) read the first half of each step's batch, ranks 2, 3 the
    second; with grad_accum 2 each in two micro-batches. Together: the step's whole batch, once."""
    ds = PatternDataset(seq_len=8)
    whole, _ = ds.sample_batch("train", 8, step=3)
    seen = {}
    for rank in range(4):
        info = DistInfo(rank=rank, world_size=4, launched=True, cp=2)
        assert (info.dp_rank, info.dp_size) == (rank // 2, 2)
        seen[rank] = torch.cat([x for x, _ in micro_batches(ds, 8, 2, 3, torch.device("cpu"), info)])
    assert torch.equal(seen[0], seen[1]) and torch.equal(seen[2], seen[3])
    assert torch.equal(torch.cat([seen[0], seen[2]]), whole)
