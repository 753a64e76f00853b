"""A CPU model of the Gluon forward's barrier protocol (kernels/flash_attn/forward_hopper.py):
the producer warp and CONSUMERS warpgroups as coroutines over mbarriers with the hardware's
phase-parity waits, run under many random interleavings. It checks what a GPU run can only show
as a hang or a wrong number:

- no deadlock, for every (CONSUMERS, STAGES, key blocks per tile), one tile per program or several
  (the persistent grid: the ring position and the turn count run on across a program's tiles);
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
    def __init__(self, consumers: int, stages: int, tiles: list[int]):
        self.C, self.S, self.tiles = consumers, stages, tiles  # tiles: each one's number of key blocks
        B = Barrier
        self.q_bar, self.q_empty = [B(1) for _ in range(consumers)], [B(1) for _ in range(consumers)]
        self.q_slot = [None] * consumers  # which tile's Q slice each buffer holds
        self.turn = [B(1) for _ in range(consumers)]
        self.k_ready, self.v_ready = [B(1) for _ in range(stages)], [B(1) for _ in range(stages)]
        self.k_empty, self.v_empty = [B(consumers) for _ in range(stages)], [B(consumers) for _ in range(stages)]
        self.k_slot, self.v_slot = [None] * stages, [None] * stages  # which tile each slot holds
        self.k_readers, self.v_readers = [set() for _ in range(stages)], [set() for _ in range(stages)]
        self.issues: list[tuple[int, int]] = []  # (warpgroup, GEMM turn) in issue order

    # each yield hands back a predicate: the coroutine resumes once it holds
    def producer(self):
        it = 0
        for i, n in enumerate(self.tiles):
            for w in range(self.C):
                yield lambda w=w, i=i: self.q_empty[w].passes((i & 1) ^ 1)
                self.q_slot[w] = i
                self.q_bar[w].arrive()  # TMA of Q's slice w (its bytes land at once in this model)
            for j in range(n):
                s = it % self.S
                phase = ((it // self.S) & 1) ^ 1
                yield lambda s=s, phase=phase: self.k_empty[s].passes(phase)
                assert not self.k_readers[s], f"K slot {s} refilled while {self.k_readers[s]} may still read it"
                self.k_slot[s] = (i, j)
                self.k_ready[s].arrive()
                yield lambda s=s, phase=phase: self.v_empty[s].passes(phase)
                assert not self.v_readers[s], f"V slot {s} refilled while {self.v_readers[s]} may still read it"
                self.v_slot[s] = (i, j)
                self.v_ready[s].arrive()
                it += 1

    def wait_turn(self, t, w):
        parity = (t & 1) ^ 1 if w == 0 else t & 1
        return lambda: self.turn[w].passes(parity)

    def consumer(self, w):
        nxt = (w + 1) % self.C
        it0 = t0 = 0
        for i, n in enumerate(self.tiles):
            yield lambda i=i: self.q_bar[w].passes(i & 1)
            assert self.q_slot[w] == i, f"warpgroup {w} found Q of tile {self.q_slot[w]} for tile {i}"
            if n == 0:
                self.q_empty[w].arrive()
                continue
            yield lambda it0=it0: self.k_ready[it0 % self.S].passes((it0 // self.S) & 1)
            yield self.wait_turn(t0, w)
            self._read_k(w, it0, (i, 0))
            self.issues.append((w, t0))
            self.turn[nxt].arrive()
            self._release_k(w, it0)  # warpgroup_mma_wait(0): S_0 landed
            for j in range(1, n):
                it = it0 + j
                yield lambda it=it: self.k_ready[it % self.S].passes((it // self.S) & 1)
                yield self.wait_turn(t0 + j, w)
                self._read_k(w, it, (i, j))
                yield lambda it=it: self.v_ready[(it - 1) % self.S].passes(((it - 1) // self.S) & 1)
                self._read_v(w, it - 1, (i, j - 1))
                self.issues.append((w, t0 + j))
                self.turn[nxt].arrive()
                self._release_k(w, it)  # warpgroup_mma_wait(1): S_j landed
                self._release_v(w, it - 1)  # warpgroup_mma_wait(0): PV_{j-1} landed
            assert self.q_slot[w] == i
            self.q_empty[w].arrive()  # every S of the tile has landed
            last = it0 + n - 1
            yield lambda last=last: self.v_ready[last % self.S].passes((last // self.S) & 1)
            yield self.wait_turn(t0 + n, w)
            self._read_v(w, last, (i, n - 1))
            self.issues.append((w, t0 + n))
            self.turn[nxt].arrive()
            self._release_v(w, last)
            it0, t0 = it0 + n, t0 + n + 1

    def _read_k(self, w, it, tile_block):
        s = it % self.S
        assert self.k_slot[s] == tile_block, f"warpgroup {w} read K slot {s} expecting {tile_block}, found {self.k_slot[s]}"
        self.k_readers[s].add(w)

    def _read_v(self, w, it, tile_block):
        s = it % self.S
        assert self.v_slot[s] == tile_block, f"warpgroup {w} read V slot {s} expecting {tile_block}, found {self.v_slot[s]}"
        self.v_readers[s].add(w)

    def _release_k(self, w, j):
        self.k_readers[j % self.S].discard(w)
        self.k_empty[j % self.S].arrive()

    def _release_v(self, w, j):
        self.v_readers[j % self.S].discard(w)
        self.v_empty[j % self.S].arrive()


def run(consumers: int, stages: int, tiles: list[int], rng: random.Random) -> None:
    kernel = Kernel(consumers, stages, tiles)
    agents = [kernel.producer()] + [kernel.consumer(w) for w in range(consumers)]
    waiting = {i: (lambda: True) for i in range(len(agents))}
    while waiting:
        ready = [i for i, cond in waiting.items() if cond()]
        assert ready, f"deadlock: CONSUMERS={consumers} STAGES={stages} tiles={tiles}, blocked: {sorted(waiting)}"
        i = rng.choice(ready)
        try:
            waiting[i] = next(agents[i])
        except StopIteration:
            del waiting[i]
    turns = sum(n + 1 for n in tiles if n)
    expected = [(w, t) for t in range(turns) for w in range(consumers)]
    assert kernel.issues == expected, f"turns out of order: {kernel.issues}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=300, help="random interleavings per configuration")
    args = ap.parse_args()
    rng = random.Random(0)
    # one tile per program (0-8 key blocks), and persistent programs: several tiles of random sizes
    layouts = [[n] for n in range(9)] + [[rng.randrange(0, 6) for _ in range(rng.randrange(2, 5))] for _ in range(12)]
    configs = list(itertools.product((2, 3), (2, 3, 4), layouts))
    for consumers, stages, tiles in configs:
        for _ in range(args.trials):
            run(consumers, stages, tiles, rng)
    print(f"{len(configs)} configurations x {args.trials} interleavings: no deadlock, turns in order, every read sees its tile")


if __name__ == "__main__":
    main()
