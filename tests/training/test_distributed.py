"""training/distributed.py: several ranks (gloo, CPU) through train.py, launched by torchrun's own agent
(the launches are marked slow: ~3-8 s each on 2 cores).

Each launch runs torchrun's elastic agent in-process (`elastic_launch`, what `torchrun` calls)
with forked workers, so no worker pays for importing torch again; each worker runs train.py's
`__main__` exactly as `torchrun --nproc_per_node=2 train.py ...` would. The single-process
references run train() in this process on the same composed config.
"""

import contextlib
import json
import os
import runpy
import signal
import socket
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Callable

import pytest
import torch
from _torchrun import run_on_ranks
from conftest import REPO, SHRINK, compose_config
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

import data.dataset
import data.tokenizer
import training.loop
from training import distributed, train
from training.checkpoint import CHECKPOINT_NAME, load_checkpoint
from training.config import ConfigError, validate_config
from training.metrics import METRICS_FILE, SUMMARY_FILE

# SHRINK (lr 1e-2, warmup 1) on random tokens, which every process generates alike (no cache files).
TINY = [*SHRINK, "attention=sdpa", "batch_size=8", "grad_accum=2", "steps=4", "eval_every=2"]
RUN = [*TINY, "data=synthetic", "data.vocab_size=100", "data.num_tokens=5000"]


def _worker(argv: list[str], scratch: str, prepare: Callable[[int], None] | None) -> None:
    """One rank: train.py's __main__ with `argv`, as under torchrun, after `prepare(rank)`."""
    torch.set_num_threads(1)  # what torchrun's OMP_NUM_THREADS=1 does for its workers
    tempfile.tempdir = scratch  # where rank > 0 keeps Hydra's throwaway folder
    if prepare is not None:
        prepare(int(os.environ["RANK"]))
    sys.argv = ["train.py", *argv]
    runpy.run_path(str(REPO / "train.py"), run_name="__main__")


def launch(
    tmp_path: Path, nprocs: int, *overrides: str, run_dir: Path | None = None,
    prepare: Callable[[int], None] | None = None, base: list[str] = RUN,
) -> Path:
    """Run train.py on `nprocs` ranks through torchrun's agent; returns the run folder (rank 0's)."""
    run_dir = run_dir or tmp_path / f"run-{uuid.uuid4().hex[:6]}"
    scratch = tmp_path / "scratch"
    scratch.mkdir(exist_ok=True)
    argv = [*base, *overrides, f"hydra.run.dir={run_dir}", f"cache_dir={tmp_path / 'cache'}"]
    run_on_ranks(tmp_path, nprocs, _worker, argv, str(scratch), prepare)
    return run_dir


def fail_at_step_2(rank_to_fail: int, how: str) -> Callable[[int], None]:
    """A `prepare` that makes one rank raise, or hang, in its 2nd step, while the other waits for it."""

    def prepare(rank: int) -> None:
        if rank != rank_to_fail:
            return
        real_step, calls = training.loop.train_step, []

        def failing_step(*args, **kwargs):
            calls.append(1)
            if len(calls) == 2:  # the other rank is then waiting in step 2's all-reduce
                if how == "raise":
                    raise RuntimeError(f"rank {rank} failed on purpose")
                # Hang. The agent SIGTERMs this rank once rank 0 fails; a rank that ignores it (a hang in
                # C code, or training.loop finishing its step) is SIGKILLed 30 s later, which the test skips.
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                time.sleep(120)
            return real_step(*args, **kwargs)

        training.loop.train_step = failing_step

    return prepare


def single(tmp_path: Path, *overrides: str) -> Path:
    """The same run in this process, one rank; returns its folder."""
    run_dir = tmp_path / f"single-{uuid.uuid4().hex[:6]}"
    train(compose_config(*RUN, *overrides, f"out_dir={run_dir}", f"cache_dir={tmp_path / 'cache'}"))
    return run_dir


def steps(run_dir: Path) -> list[tuple[int, float, float | None]]:
    rows = [json.loads(line) for line in (run_dir / METRICS_FILE).read_text().splitlines()]
    return [(r["step"], r["train/loss"], r.get("val/loss")) for r in rows if "train/loss" in r]


def assert_same_run(a: Path, b: Path, lr: float = 1e-2) -> None:
    """Same losses, weights and Adam moments, up to what float rounding explains.

    Ranks add gradients up in another order than one process: differences of ~1e-7 relative.
    Adam turns a gradient g into a step of about lr·g/(|g| + 1e-8), so where g is zero up to
    rounding (the key bias: softmax ignores it) rounding-level g ~1e-10 moves a weight by up
    to a few percent of lr; later gradients, taken at those weights, differ by ~1e-4 of their
    scale. A lost rank's gradient or wrong rows instead change losses in the 3rd digit and
    weights by about lr.
    """
    sa, sb = steps(a), steps(b)
    assert [s for s, _, _ in sa] == [s for s, _, _ in sb]
    for (step, la, va), (_, lb, vb) in zip(sa, sb):
        assert la == pytest.approx(lb, rel=1e-5), (step, la, lb)
        assert (va is None) == (vb is None) and (va is None or va == pytest.approx(vb, rel=1e-5)), (step, va, vb)
    ca, cb = load_checkpoint(a / CHECKPOINT_NAME), load_checkpoint(b / CHECKPOINT_NAME)
    assert ca["step"] == cb["step"] and ca["model"].keys() == cb["model"].keys()
    for key in ca["model"]:
        x, y = ca["model"][key], cb["model"][key]
        torch.testing.assert_close(x, y, rtol=0, atol=0.05 * lr, msg=lambda m: f"{key}: {m}")
    oa, ob = ca["optimizer"], cb["optimizer"]
    as_lists = lambda groups: json.loads(json.dumps(groups))  # noqa: E731  betas: tuple, or list after FSDP's loader
    assert as_lists(oa["param_groups"]) == as_lists(ob["param_groups"]) and oa["state"].keys() == ob["state"].keys()
    for i in oa["state"]:
        assert torch.equal(oa["state"][i]["step"], ob["state"][i]["step"])
        for name in ("exp_avg", "exp_avg_sq"):
            x, y = oa["state"][i][name], ob["state"][i][name]
            torch.testing.assert_close(x, y, rtol=0, atol=1e-3 * y.abs().max().item(), msg=lambda m: f"{i} {name}: {m}")


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    """The reference: 4 steps in one process (2 micro-batches of 4 each), checkpoints at 2 and 4."""
    return single(tmp_path_factory.mktemp("straight"), "ckpt_every=2")


@pytest.mark.slow
def test_two_ddp_ranks_equal_one_process_which_resumes_their_checkpoint(tmp_path, straight):
    # Each rank runs 2 micro-batches of 2 per step (DDP all-reduces in the second only), then stops.
    two = launch(tmp_path, 2, "parallel=ddp", "ckpt_every=2", "stop_at=2")
    # Rank 0 alone wrote: one line per step, one console, one summary; rank 1's Hydra scratch is gone.
    written = sorted(p.name for p in two.iterdir())
    assert written == sorted([".hydra", CHECKPOINT_NAME, METRICS_FILE, SUMMARY_FILE, "train.log"])
    assert [s for s, _, _ in steps(two)] == [1, 2]
    log = (two / "train.log").read_text()
    assert log.count("step 2/4") == 1 and "ranks=2, parallel=ddp, micro_batch=2" in log
    assert json.loads((two / SUMMARY_FILE).read_text())["ranks"] == 2  # tokens/s counts both ranks' tokens
    assert list((tmp_path / "scratch").glob("flash-gpt-rank*")) == []  # (torch keeps caches there too)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["scratch", "torchelastic", two.name])
    # One process continues the 2-rank run: the whole run equals the single-process one.
    train(compose_config(*RUN, "ckpt_every=2", "resume=true", f"out_dir={two}"))
    assert_same_run(two, straight)


@pytest.mark.slow
def test_two_fsdp_ranks_resume_a_single_process_checkpoint_and_save_a_full_one(tmp_path, straight):
    one = single(tmp_path, "ckpt_every=2", "stop_at=2")
    launch(tmp_path, 2, "parallel=fsdp", "ckpt_every=2", "resume=true", run_dir=one)
    assert "ranks=2, parallel=fsdp, micro_batch=2" in (one / "train.log").read_text()
    assert_same_run(one, straight)  # FSDP's sharded state, gathered, in the single-process layout


@pytest.mark.slow
def test_a_failing_rank_ends_the_job_with_its_message(tmp_path, capfd):
    start = time.monotonic()
    with pytest.raises(ChildFailedError) as err:
        launch(tmp_path, 2, "steps=50", prepare=fail_at_step_2(1, "raise"))
    # The agent saw rank 1 fail and stopped rank 0, which was waiting for it in an all-reduce.
    assert time.monotonic() - start < 30
    assert "rank 1 failed on purpose" in str(err.value)  # torchrun's closing report names the cause
    assert "rank 1 failed on purpose" in capfd.readouterr().err  # and Hydra printed it on the console


@pytest.mark.slow
def test_a_hung_rank_times_out_instead_of_hanging(tmp_path):
    start = time.monotonic()
    with pytest.raises(ChildFailedError) as err:
        launch(tmp_path, 2, "steps=50", "dist_timeout_s=3", prepare=fail_at_step_2(1, "hang"))
    assert time.monotonic() - start < 60  # rank 1 would sleep 120 s
    assert err.value.get_first_failure()[0] == 0  # rank 0's collective gave up after 3 s


def test_batch_must_split_over_ranks():
    cfg = compose_config("batch_size=6", "grad_accum=1")
    validate_config(cfg, world_size=2)  # 3 per rank
    with pytest.raises(ConfigError, match=r"divisible by ranks × grad_accum = 4 × 1 .*batch_size=8"):
        validate_config(cfg, world_size=4)
    with pytest.raises(ConfigError, match="parallel must be one of ddp, fsdp"):
        validate_config(compose_config("parallel=zero"))


def test_ranks_other_than_0_keep_hydra_out_of_the_run_folder(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert distributed.from_env() == distributed.DistInfo(rank=1, local_rank=1, world_size=2, launched=True)
    argv = ["train.py", "steps=3"]
    with distributed.torchrun_process(argv):
        scratch = Path(argv[2].split("=", 1)[1].strip("'"))
        assert scratch.is_dir() and "hydra.output_subdir=null" in argv and "hydra/job_logging=none" in argv
    assert not scratch.exists()
    monkeypatch.setenv("RANK", "0")
    argv = ["train.py"]
    with distributed.torchrun_process(argv):
        pass
    assert argv == ["train.py"]  # rank 0 writes the run folder as a single process does
    monkeypatch.delenv("RANK")
    assert distributed.from_env() == distributed.DistInfo()  # plain `python train.py`


@pytest.mark.slow
def test_ranks_on_a_cold_cache_build_the_tokenizer_and_tokens_once(tmp_path):
    """Both ranks call build_dataset at once; its file locks let one build while the other waits."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join((REPO / name).read_text() for name in ("README.md", "training/loop.py")))
    builds = tmp_path / "builds.txt"

    def count_builds(rank: int) -> None:
        def counted(name, real):
            def build(*args, **kwargs):
                with open(builds, "a") as f:  # one short O_APPEND write per build: lines do not interleave
                    f.write(f"{name} rank {rank}\n")
                return real(*args, **kwargs)
            return build

        data.tokenizer.train_bpe = counted("tokenizer", data.tokenizer.train_bpe)
        data.dataset._write_tokens = counted("tokens", data.dataset._write_tokens)

    run = launch(tmp_path, 2, "data=text", f"data.paths=[{corpus}]", "data.vocab_size=300", "steps=1",
                 prepare=count_builds, base=TINY)
    made = sorted(line.split(" rank")[0] for line in builds.read_text().splitlines())
    assert made == ["tokenizer", "tokens", "tokens"], made  # tokens: one file per split
    assert json.loads((run / SUMMARY_FILE).read_text())["status"] == "ok"


@pytest.mark.parametrize("ending", [None, RuntimeError("boom"), KeyboardInterrupt(), SystemExit(1)])
def test_the_process_group_ends_however_the_process_ends(monkeypatch, ending):
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port.getsockname()[1])}
    port.close()
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with contextlib.suppress(type(ending)) if ending else contextlib.nullcontext():
        with distributed.torchrun_process(["train.py"]):
            distributed.init(distributed.from_env(), torch.device("cpu"), timeout_s=10)
            assert torch.distributed.is_initialized() and torch.distributed.get_backend() == "gloo"
            if ending is not None:
                raise ending
    assert not torch.distributed.is_initialized()
