#!/usr/bin/env python
"""The fleet under load while its broker is down for 30 s.

Starts a ``redis-server``, two CPU SGLang servers (SmolLM2-135M-Instruct,
LOOKAHEAD with ``--speculative-lookahead-share``) and ``sglang-router``
(round robin) on free localhost ports; keeps ``--clients`` clients per
replica sending requests straight to it, and as many through the router;
kills Redis after ``--before`` seconds, starts it again ``--down`` seconds
later (default 30), and goes on for ``--after`` seconds.  Prints the
requests served and failed per replica and phase, each replica's share
counters, and whether a question answered on one replica after the restart
is drafted from on the other (its AL there, against its first).

    python benchmarks/fleet_outage.py            # about 3 minutes on 2 CPU cores
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "cpu"), str(REPO / "tools"), str(REPO / "tests" / "support")]

from cpu_env import cpu_env, cpu_server_args  # noqa: E402
from lookahead.validate.server import SGLangServer, free_port  # noqa: E402
from real_model import real_model_path  # noqa: E402
from redis_server import RedisServer  # noqa: E402


def _post(url: str, body: dict, timeout: float = 300) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


def _generate(url: str, text: str, salt: str, max_new: int) -> dict:
    return _post(url + "/generate", {"text": f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n",
                                     "cache_salt": salt,
                                     "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new,
                                                         "ignore_eos": True}})


def _share_counts(url: str) -> dict:
    out = collections.Counter()
    with urllib.request.urlopen(url + "/metrics", timeout=60) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("sglang:lookahead_share_entries{"):
                what = line.split('what="', 1)[1].split('"', 1)[0]
                out[what] += float(line.rsplit(" ", 1)[1])
    return dict(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", type=float, default=20.0)
    ap.add_argument("--down", type=float, default=30.0)
    ap.add_argument("--after", type=float, default=20.0)
    ap.add_argument("--clients", type=int, default=1, help="clients per replica, and as many through the router")
    ap.add_argument("--max-new", type=int, default=32)
    args = ap.parse_args(argv)

    work = REPO / ".cache" / "fleet_outage"
    work.mkdir(parents=True, exist_ok=True)
    env = cpu_env()
    env["PYTHONPATH"] = ":".join([env["PYTHONPATH"], str(REPO)])
    broker = RedisServer(work / "redis", password="outage-check").start()
    servers = [SGLangServer(real_model_path(), cpu_server_args(max_running_requests=4) + [
        "--speculative-algorithm", "LOOKAHEAD", "--speculative-lookahead-share", broker.url(),
        "--served-model-name", "fleet-outage", "--enable-metrics"], env, work / f"server-{n}.log") for n in "ab"]
    router = None
    phase = "before"
    served = collections.Counter()
    failed = collections.Counter()
    errors = []
    stop = threading.Event()
    try:
        for s in servers:
            s.start(timeout=600)
        port = free_port()
        router = subprocess.Popen([sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
                                   "--port", str(port), "--worker-urls", *[s.url for s in servers],
                                   "--policy", "round_robin", "--log-level", "warn"],
                                  stdout=open(work / "router.log", "w"), stderr=subprocess.STDOUT)
        router_url = f"http://127.0.0.1:{port}"
        for _ in range(120):
            try:
                urllib.request.urlopen(router_url + "/health", timeout=5)
                break
            except OSError:
                time.sleep(1)
        targets = [("a", servers[0].url), ("b", servers[1].url), ("router", router_url)]

        def client(name, url, k):
            i = 0
            while not stop.is_set():
                here = phase
                try:
                    out = _generate(url, f"Write a line about topic {k}-{i % 7}.", f"load-{name}-{k}", args.max_new)
                    assert out["meta_info"]["completion_tokens"] == args.max_new
                    served[(name, here)] += 1
                except Exception as exc:
                    failed[(name, here)] += 1
                    errors.append(f"{name} {here}: {exc!r}")
                i += 1

        threads = [threading.Thread(target=client, args=(n, u, k), daemon=True)
                   for n, u in targets for k in range(args.clients)]
        for t in threads:
            t.start()
        time.sleep(args.before)
        broker.stop()
        phase = "down"
        time.sleep(args.down)
        broker.start()
        phase = "after"
        time.sleep(args.after)
        stop.set()
        for t in threads:
            t.join(timeout=300)
        b_before = _share_counts(servers[1].url).get("received", 0)
        first = _generate(servers[0].url, "Name the seven continents.", "check", 48)
        deadline = time.monotonic() + 60
        while _share_counts(servers[1].url).get("received", 0) <= b_before and time.monotonic() < deadline:
            time.sleep(0.2)
        second = _generate(servers[1].url, "Name the seven continents.", "check", 48)
        counts = {n: _share_counts(s.url) for n, s in zip("ab", servers)}
    finally:
        stop.set()
        if router is not None:
            router.kill()
        for s in servers:
            s.stop()
        broker.stop()

    def al(o):
        return o["meta_info"]["completion_tokens"] / max(1, o["meta_info"]["spec_verify_ct"])

    print(f"\nRedis down for {args.down:g} s under load ({args.clients} client(s) per replica and as many "
          f"through the router, {args.max_new} tokens per request):\n")
    print("| target | served before | served while down | served after | failed |")
    print("|---|---|---|---|---|")
    for name, _ in targets:
        print(f"| {name} | {served[(name, 'before')]} | {served[(name, 'down')]} | {served[(name, 'after')]} | "
              f"{sum(failed[(name, p)] for p in ('before', 'down', 'after'))} |")
    print(f"\nshare counters: {json.dumps(counts)}")
    print(f"after the restart, a question answered on a, then asked on b: AL {al(first):.2f} -> {al(second):.2f}")
    if errors:
        print("errors:", *errors[:10], sep="\n  ")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
