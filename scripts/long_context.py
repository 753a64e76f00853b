"""The long-context memory frontier on one GPU: for naive, sdpa and flash, with activation
checkpointing off and on, which seq_len in 8K..256K trains at batch 1, at what speed and memory.

    python scripts/long_context.py                                   # the whole sweep (see bench/long_context.py)
    python scripts/long_context.py --attention flash sdpa --checkpointing blocks --seq-lens 131072 262144
    python scripts/long_context.py --position learned rope --seq-lens 32768 65536 --checkpointing none
    python scripts/long_context.py --out docs/results/long_context.json --plot docs/long_context.png
    python scripts/long_context.py --quick                           # CPU smoke run: tiny model, seq_len 32 and 64
    python scripts/long_context.py --no-profile --steps 3            # faster: no attention share
    python scripts/long_context.py --dry-run                         # print each point's train.py command
    python scripts/long_context.py --train data=stdlib               # everything after --train goes to train.py

Each point is `python train.py experiment=long-context attention=A seq_len=N checkpointing=C
model.position=P batch_size=1 profile=true data=synthetic steps=7 ...` in its own process (run
folders under outputs/bench/<date>/long_context/runs/ unless --runs-dir); an out-of-memory point
is a row with status "oom", and the longer seq_lens of that line are skipped (--no-skip runs them).
The JSON ({"meta", "rows"}, default outputs/bench/<date>/long_context/long_context.json) is
rewritten after every point; running the same command again continues where it stopped
(points already ok or oom are kept; --redo measures everything again). The plot goes beside it.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

import torch

from bench.cli import fill_defaults
from bench.long_context import ATTENTIONS, CHECKPOINTING, CONVENTION, SEQ_LENS, frontier, points, render, sweep, train_command
from bench.plots import plot_long_context
from bench.results import default_out, output_dir, run_meta
from model.gpt import POSITIONS
from training.profiling import FIRST_UNTRACED_STEP

SCRIPT = "long_context"
DEFAULTS = dict(model="gpt2-medium", seq_lens=list(SEQ_LENS), attention=list(ATTENTIONS), checkpointing=list(CHECKPOINTING),
                position=["rope"], steps=7, data="synthetic", timeout_s=1800.0)
QUICK = dict(model="tiny", seq_lens=[32, 64], attention=["sdpa"], checkpointing=list(CHECKPOINTING), position=["rope"],
             steps=6, data="synthetic", timeout_s=300.0)
# --quick: a CPU-sized train.py (before the user's --train overrides, which win)
QUICK_TRAIN = ["device=cpu", "compile=false", "dtype=fp32", "model.n_layer=1", "data.vocab_size=256",
               "data.num_tokens=20000", "loss_chunk=32"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--attention", nargs="+", choices=ATTENTIONS, help=f"default: {' '.join(ATTENTIONS)}")
    p.add_argument("--checkpointing", nargs="+", choices=CHECKPOINTING, help="default: none blocks")
    p.add_argument("--position", nargs="+", choices=POSITIONS, help="default: rope (the experiment's)")
    p.add_argument("--seq-lens", nargs="+", type=int, help=f"default: {' '.join(map(str, SEQ_LENS))}")
    p.add_argument("--model", help="model preset (default gpt2-medium)")
    p.add_argument("--steps", type=int, help="steps per point: the first compiles, 2-5 run under the profiler, the speed is the median of the rest (default 7)")
    p.add_argument("--no-profile", dest="profile", action="store_false",
                   help="no profiler (attention_share stays null); then 2 steps are enough")
    p.add_argument("--data", help="data preset (default synthetic: speed and memory only, no tokenizer to build)")
    p.add_argument("--timeout-s", type=float, help="a point running longer is stopped: status timeout (default 1800)")
    p.add_argument("--quick", action="store_true", help="CPU smoke run: tiny model, seq_len 32 and 64, sdpa")
    p.add_argument("--no-skip", action="store_true", help="also run the seq_lens above a line's first out-of-memory")
    p.add_argument("--redo", action="store_true", help="measure again the points already in --out")
    p.add_argument("--dry-run", action="store_true", help="print each point's train.py command, run nothing")
    p.add_argument("--out", type=Path, help=f"result JSON (default {default_out(SCRIPT, 'long_context.json')})")
    p.add_argument("--plot", type=Path, help="the plot (default: long_context.png beside --out)")
    p.add_argument("--runs-dir", type=Path, help=f"the points' run folders (default {output_dir(SCRIPT) / 'runs'})")
    p.add_argument("--train", dest="overrides", nargs=argparse.REMAINDER, default=[], metavar="KEY=VALUE",
                   help="the rest of the command line goes to every train.py (e.g. --train compile=false)")
    args = fill_defaults(p, p.parse_args(argv), DEFAULTS, QUICK)
    if args.quick:
        args.overrides = [*QUICK_TRAIN, *args.overrides]
    # the speed is the median of the steps after the first (compilation) that the profiler did not trace
    if args.steps < (FIRST_UNTRACED_STEP if args.profile else 2):
        p.error(f"--steps must be at least {FIRST_UNTRACED_STEP} with the profiler (it traces steps 2-{FIRST_UNTRACED_STEP - 1}, "
                f"which the speed leaves out), 2 without (got {args.steps})")
    args.out = args.out or default_out(SCRIPT, "long_context.json")
    args.plot = args.plot or args.out.with_name("long_context.png")
    args.runs_dir = args.runs_dir or output_dir(SCRIPT) / "runs"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM (timeout, a batch system) as an exception: subprocess.run then kills the point's train.py
    # on the way out, instead of leaving it running with the GPU's memory.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if args.dry_run:
        for point in points(args):
            print(" ".join(train_command(point, args, args.runs_dir / point.name)))
        return 0
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gpu_gib = torch.cuda.get_device_properties(device).total_memory / 2**30 if device.type == "cuda" else None
    meta = run_meta(device, CONVENTION, model=args.model, steps=args.steps, data=args.data,
                    train_overrides=args.overrides, gpu_memory_gib=gpu_gib)
    rows = sweep(args, meta)
    print("\n" + render(rows))
    print("\nfrontier (longest seq_len that trained / first out of memory):")
    for f in frontier(rows):
        print(f"  {f['attention']:>5} checkpointing {f['checkpointing']:<6} {f['position']:<7} "
              f"{f['longest_ok'] or '-'} / {f['first_oom'] or '-'}")
    print(f"\nwrote {args.out}\nwrote {plot_long_context(rows, args.plot, gpu_gib)}", flush=True)
    failed = [r for r in rows if r["status"] in ("error", "timeout")]
    for r in failed:
        print(f"  {r['attention']} {r['checkpointing']} {r['seq_len']}: {r['status']}: {r['note']} (see {r['run_dir']})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
