#!/usr/bin/env python3
"""How late this machine wakes a sleeping thread: a floor under every latency benchmark.

    python3 benches/host-jitter.py [SECONDS] [SLEEP_US]

Sleeps SLEEP_US (default 500 µs) over and over for SECONDS (default 8) on an otherwise idle
machine and prints how much later than asked each wake-up came (p50, p99, p99.9, max). On a
machine whose p99 is above a millisecond, no process on it can show a p99 added latency under a
millisecond for work that waits on the network, however little CPU that work takes.
"""
import sys
import time


def positive(args: list, i: int, name: str, default: float) -> float:
    """Argument i as a positive finite number, or the default; exits with a usage line if not."""
    if len(args) <= i:
        return default
    try:
        value = float(args[i])
    except ValueError:
        value = float("nan")
    if not (0 < value < float("inf")):
        sys.exit(f"host-jitter.py: {name} must be a positive number, not {args[i]!r}\n"
                 "usage: python3 benches/host-jitter.py [SECONDS] [SLEEP_US]")
    return value


def main() -> None:
    if len(sys.argv) > 3:
        sys.exit("usage: python3 benches/host-jitter.py [SECONDS] [SLEEP_US]")
    seconds = positive(sys.argv, 1, "SECONDS", 8.0)
    sleep_s = positive(sys.argv, 2, "SLEEP_US", 500.0) / 1e6
    late = []
    end = time.perf_counter() + seconds
    # One sleep is always taken, however short SECONDS is.
    while True:
        t = time.perf_counter()
        time.sleep(sleep_s)
        late.append(time.perf_counter() - t - sleep_s)
        if time.perf_counter() >= end:
            break
    late.sort()
    n = len(late)

    def q(p: float) -> float:
        return late[min(n - 1, int(n * p))] * 1e6

    print(
        f"{n} sleeps of {sleep_s * 1e6:.0f} us: woken late by p50 {q(0.5):.0f} us, "
        f"p99 {q(0.99):.0f} us, p99.9 {q(0.999):.0f} us, max {late[-1] * 1e6:.0f} us"
    )


if __name__ == "__main__":
    main()
