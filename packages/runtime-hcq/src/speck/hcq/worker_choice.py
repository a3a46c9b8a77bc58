"""One worker or all of them, chosen by measured time: for a CPU graph's runs (speck.hcq.graph) and a big kernel's
direct launches (speck.hcq.cpu). On a machine whose other cores run other processes, or whose second core shares
the first one's units, waking and synchronising workers can cost more than splitting gains (16M-float sums, 4
streams per worker: 9.4 GB/s on one thread, 5.6 GB/s on two with the second core busy); results never depend on
the split, so the choice is free to change."""

from __future__ import annotations

# timed runs per candidate worker count before the faster (by its best time) is chosen
TUNE_RUNS = 2
# runs after which the choice is measured again (other processes come and go on a shared machine); the slower
# candidate then costs TUNE_RUNS extra runs in this many. A clear choice (the other candidate at least
# CLEAR_MARGIN x slower) that a measurement confirms doubles the interval, up to RETUNE_MAX: a CNN training step
# whose one-worker runs take twice as long paid 1% of its time re-confirming every 200 steps
RETUNE_EVERY = 200
RETUNE_MAX = 3200
CLEAR_MARGIN = 1.3


def next_retune_interval(interval: int, previous: int | None, chosen: int, trials: dict[int, list[float]]) -> int:
    """Runs until the worker count is measured again: doubled (at most RETUNE_MAX) when the measurement confirmed
    the previous choice by a clear margin, else back to RETUNE_EVERY."""
    best = {k: min(v) for k, v in trials.items() if v}
    others = [t for k, t in best.items() if k != chosen]
    clear = bool(others) and min(others) >= CLEAR_MARGIN * best[chosen]
    return min(interval * 2, RETUNE_MAX) if clear and previous == chosen else RETUNE_EVERY


class WorkerChoice:
    """Between 1 worker and `n`: `pick()` the count for the next run, `record()` how long it took. While measuring,
    the candidates alternate, `first` first, TUNE_RUNS timed runs each (`in_a_row`: each candidate's runs back to
    back, as a CPU graph's: after a split graph run the workers spin for the next one (speck.hcq.cpu), so a split
    run right after a one-worker run pays for waking them, which steady split runs don't; the best of consecutive
    runs is the steady time); then the faster is `chosen` until the
    next measurement. `skip_first`: the very first run is not counted (a direct launch's first split pays the first
    touch of its output, cold caches and sleeping workers: a 1024 matmul's first split launch took 75-89 ms, its
    next ones ~50 ms, and with two trials a side that decided for one worker). With n <= 1 there is nothing to
    choose: `chosen` is 1."""

    __slots__ = ("chosen", "every", "first", "in_a_row", "n", "previous", "since", "trials", "warm")

    def __init__(self, n: int, first: int | None = None, skip_first: bool = False, in_a_row: bool = False) -> None:
        self.in_a_row = in_a_row
        self.n, self.since, self.every = n, 0, RETUNE_EVERY
        self.first = n if first is None else first
        self.chosen: int | None = None if n > 1 else 1  # the worker count runs use; None while measuring
        self.previous: int | None = None  # the choice before the current measurement
        self.trials: dict[int, list[float]] = {n: [], 1: []}
        self.warm = not skip_first  # the uncounted first run is done

    def pick(self) -> int:
        if self.chosen is not None:
            return self.chosen
        other = 1 if self.first == self.n else self.n
        if self.in_a_row:
            return self.first if len(self.trials[self.first]) < TUNE_RUNS else other
        return self.first if len(self.trials[self.first]) <= len(self.trials[other]) else other

    def record(self, workers: int, seconds: float) -> None:
        if self.n <= 1:
            return
        if not self.warm:
            self.warm = True
            return
        if self.chosen is None:
            trials = self.trials
            trials[workers].append(seconds)
            if all(len(v) >= TUNE_RUNS for v in trials.values()):
                chosen = min(trials, key=lambda k: min(trials[k]))
                self.every = next_retune_interval(self.every, self.previous, chosen, trials)
                self.chosen, self.since = chosen, 0
            return
        self.since += 1
        if self.since >= self.every:  # the machine's load changes: measure again
            self.previous, self.chosen, self.trials = self.chosen, None, {self.n: [], 1: []}
