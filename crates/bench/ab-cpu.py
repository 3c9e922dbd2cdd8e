#!/usr/bin/env python3
"""CPU per turn of two builds, A/B in one run (issue 19).

Runs `turnpike-bench burst` of build A and build B alternately (the order swapped every round, so
a noisy neighbour hits both alike) and charges each run what the issue judges, server + roles: the
bench process's own CPU (dispatcher, coordinator and runners run in it, beside the small chat
adapter that sends the burst) and its nats-server's, both read from /proc every 20 ms until they
exit (the last sample stands; what is missed is shut-down). The agents (child processes of the
runners, the same program in both builds) are reported apart, as everything the run cost
(RUSAGE_CHILDREN) minus the two. Start-up is included and the same for both builds.

    python3 crates/bench/ab-cpu.py OLD/turnpike-bench NEW/turnpike-bench --turns 2000 --runners 4

Prints a Markdown table: CPU ms per turn (median of the rounds), turns/s and latency as the
burst printed them, and the ratio B / A.
"""

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import time


TICK = os.sysconf("SC_CLK_TCK")


def cpu_of(pid):
    """User + system seconds of a live process (all its threads), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICK


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def run(binary, turns, runners):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.Popen(
        [binary, "burst", "--turns", str(turns), "--runners", str(runners)],
        stdout=subprocess.PIPE,
        text=True,
    )
    roles = server = 0.0
    server_pid = None
    while proc.poll() is None:
        c = cpu_of(proc.pid)
        if c is not None:
            roles = c
        if server_pid is None:
            server_pid = next((k for k in children(proc.pid) if comm(k) == "nats-server"), None)
        if server_pid is not None:
            c = cpu_of(server_pid)
            if c is not None:
                server = c
        time.sleep(0.02)
    out = proc.stdout.read()
    if proc.returncode != 0:
        sys.exit(f"{binary} burst failed ({proc.returncode}): {out!r}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    m = re.search(r"([\d.]+) turns/s, p50 ([^,]+), p99 (\S+)", out)
    if not m:
        sys.exit(f"unexpected burst output from {binary}: {out!r}")
    per = lambda s: s * 1000.0 / turns
    return {
        "cpu": per(roles + server),
        "roles": per(roles),
        "server": per(server),
        "agents": per(max(total - roles - server, 0.0)),
        "tps": float(m.group(1)),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a", help="build A's turnpike-bench (the commit before the change)")
    p.add_argument("b", help="build B's turnpike-bench (the change)")
    p.add_argument("--turns", type=int, default=2000)
    p.add_argument("--runners", type=int, default=4, help="runners of 4 slots each")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    results = {"A": [], "B": []}
    for r in range(args.rounds):
        order = [("A", args.a), ("B", args.b)]
        if r % 2:
            order.reverse()
        for label, binary in order:
            res = run(binary, args.turns, args.runners)
            results[label].append(res)
            print(f"round {r + 1} {label}: server + roles {res['cpu']:.2f} ms per turn "
                  f"(server {res['server']:.2f}, roles {res['roles']:.2f}; agents "
                  f"{res['agents']:.2f}), {res['tps']:.1f} turns/s", file=sys.stderr)
    med = lambda k, f: statistics.median(x[f] for x in results[k])
    print(f"| build | server + roles, CPU ms per turn (median of {args.rounds}) | server | roles "
          f"| agents (apart) | turns/s | rounds (server + roles) |")
    print("|---|---|---|---|---|---|---|")
    for k, binary in (("A", args.a), ("B", args.b)):
        rounds = " / ".join(f"{x['cpu']:.2f}" for x in results[k])
        print(f"| {k} `{binary}` | {med(k, 'cpu'):.2f} | {med(k, 'server'):.2f} "
              f"| {med(k, 'roles'):.2f} | {med(k, 'agents'):.2f} | {med(k, 'tps'):.1f} | {rounds} |")
    print(f"\nB / A server + roles CPU per turn: {med('B', 'cpu') / med('A', 'cpu'):.2f} "
          f"({args.runners} runners x 4 slots, {args.turns} turns per run)")


if __name__ == "__main__":
    main()
