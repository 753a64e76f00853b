"""A CPU model of the Gluon forward's barrier protocol (kernels/flash_attn/forward_hopper.py):
the producer warp and CONSUMERS warpgroups as coroutines over mbarriers with the hardware's
phase-parity waits, run under many random interleavings. It checks what a GPU run can only show
as a hang or a wrong number:

- no deadlock, for every (CONSUMERS, STAGES, number of key blocks);
- strict turn-taking: GEMM blocks are issued round-robin, warpgroup 0 first, in every round;
- every read of a ring slot sees the tile it expects (K_j for S_j, V_j for PV_j), and the producer
  never refills a slot that a consumer's asynchronous GEMM may still read.

    python experiments/hopper_forward/barrier_model.py [--trials 300]

The coroutines mirror the kernel's waits and arrives line by line (_producer, _consumer,
_wait_turn); a change to the kernel's protocol belongs here too.
"""
from __future__ import annotations

import argparse
import itertools
import random


class Barrier:
    """An mbarrier: `count` arrivals complete a phase; wait(parity) passes once the phase of that
    parity has completed, i.e. while the current phase's parity differs (a fresh one passes 1)."""

    def __init__(self, count: int):
        self.count, self.pending, self.phase = count, 0, 0

    def arrive(self):
        self.pending += 1
        if self.pending == self.count:
            self.pending, self.phase = 0, self.phase ^ 1

    def passes(self, parity: int) -> bool:
        return self.phase != parity


class Kernel:
    def __init__(self, consumers: int, stages: int, n_blocks: int):
        self.C, self.S, self.n = consumers, stages, n_blocks
        B = Barrier
        self.q_bar = [B(1) for _ in range(consumers)]
        self.turn = [B(1) for _ in range(consumers)]
        self.k_ready, self.v_ready = [B(1) for _ in range(stages)], [B(1) for _ in range(stages)]
        self.k_empty, self.v_empty = [B(consumers) for _ in range(stages)], [B(consumers) for _ in range(stages)]
        self.k_slot, self.v_slot = [None] * stages, [None] * stages  # which tile each slot holds
        self.k_readers, self.v_readers = [set() for _ in range(stages)], [set() for _ in range(stages)]
        self.issues: list[tuple[int, int]] = []  # (warpgroup, GEMM block) in issue order

    # each yield hands back a predicate: the coroutine resumes once it holds
    def producer(self):
        for w in range(self.C):
            self.q_bar[w].arrive()  # TMA of Q's slice w (its bytes land at once in this model)
        for j in range(self.n):
            s = j % self.S
            phase = ((j // self.S) & 1) ^ 1
            yield lambda s=s, phase=phase: self.k_empty[s].passes(phase)
            assert not self.k_readers[s], f"K slot {s} refilled while {self.k_readers[s]} may still read it"
            self.k_slot[s] = j
            self.k_ready[s].arrive()
            yield lambda s=s, phase=phase: self.v_empty[s].passes(phase)
            assert not self.v_readers[s], f"V slot {s} refilled while {self.v_readers[s]} may still read it"
            self.v_slot[s] = j
            self.v_ready[s].arrive()

    def wait_turn(self, t, w):
        parity = (t & 1) ^ 1 if w == 0 else t & 1
        return lambda: self.turn[w].passes(parity)

    def consumer(self, w):
        nxt = (w + 1) % self.C
        yield lambda: self.q_bar[w].passes(0)
        if self.n == 0:
            return
        yield lambda: self.k_ready[0].passes(0)
        yield self.wait_turn(0, w)
        self._read_k(w, 0)
        self.issues.append((w, 0))
        self.turn[nxt].arrive()
        self._release_k(w, 0)  # warpgroup_mma_wait(0): S_0 landed
        for j in range(1, self.n):
            prev = (j - 1) % self.S
            yield lambda j=j: self.k_ready[j % self.S].passes((j // self.S) & 1)
            yield self.wait_turn(j, w)
            self._read_k(w, j)
            yield lambda j=j, prev=prev: self.v_ready[prev].passes(((j - 1) // self.S) & 1)
            self._read_v(w, j - 1)
            self.issues.append((w, j))
            self.turn[nxt].arrive()
            self._release_k(w, j)  # warpgroup_mma_wait(1): S_j landed
            self._release_v(w, j - 1)  # warpgroup_mma_wait(0): PV_{j-1} landed
        last = (self.n - 1) % self.S
        yield lambda: self.v_ready[last].passes(((self.n - 1) // self.S) & 1)
        yield self.wait_turn(self.n, w)
        self._read_v(w, self.n - 1)
        self.issues.append((w, self.n))
        self.turn[nxt].arrive()
        self._release_v(w, self.n - 1)

    def _read_k(self, w, j):
        s = j % self.S
        assert self.k_slot[s] == j, f"warpgroup {w} read K slot {s} expecting K_{j}, found K_{self.k_slot[s]}"
        self.k_readers[s].add(w)

    def _read_v(self, w, j):
        s = j % self.S
        assert self.v_slot[s] == j, f"warpgroup {w} read V slot {s} expecting V_{j}, found V_{self.v_slot[s]}"
        self.v_readers[s].add(w)

    def _release_k(self, w, j):
        self.k_readers[j % self.S].discard(w)
        self.k_empty[j % self.S].arrive()

    def _release_v(self, w, j):
        self.v_readers[j % self.S].discard(w)
        self.v_empty[j % self.S].arrive()


def run(consumers: int, stages: int, n_blocks: int, rng: random.Random) -> None:
    kernel = Kernel(consumers, stages, n_blocks)
    agents = [kernel.producer()] + [kernel.consumer(w) for w in range(consumers)]
    waiting = {i: (lambda: True) for i in range(len(agents))}
    while waiting:
        ready = [i for i, cond in waiting.items() if cond()]
        assert ready, f"deadlock: CONSUMERS={consumers} STAGES={stages} n_blocks={n_blocks}, blocked: {sorted(waiting)}"
        i = rng.choice(ready)
        try:
            waiting[i] = next(agents[i])
        except StopIteration:
            del waiting[i]
    expected = [(w, t) for t in range(n_blocks + 1) for w in range(consumers)] if n_blocks else []
    assert kernel.issues == expected, f"turns out of order: {kernel.issues}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=300, help="random interleavings per configuration")
    args = ap.parse_args()
    rng = random.Random(0)
    configs = list(itertools.product((2, 3), (2, 3, 4), range(0, 9)))
    for consumers, stages, n_blocks in configs:
        for _ in range(args.trials):
            run(consumers, stages, n_blocks, rng)
    print(f"{len(configs)} configurations x {args.trials} interleavings: no deadlock, turns in order, every read sees its tile")


if __name__ == "__main__":
    main()
