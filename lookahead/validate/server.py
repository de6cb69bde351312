"""Start and stop a real ``python -m sglang.launch_server`` for tests and benchmarks.

The server runs in its own process group, so stopping it (SIGTERM to the
launcher, as SGLang expects, then SIGKILL to the group after a grace period)
never leaves a scheduler or detokenizer behind.  Its output goes to a log
file, which is quoted when the server fails to come up.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Mapping, Optional, Sequence


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_handed_out: set = set()


def free_port() -> int:
    """A free port below the kernel's ephemeral range.

    A port the kernel hands out for ``bind(0)`` can be handed out again, to
    the scheduler's gloo sockets, before the server binds its HTTP port last;
    the server then dies with "address already in use".  Ports below the
    ephemeral range are only ever taken by an explicit bind.  The pick stays
    below 22000 too, where SGLang picks its own NCCL/gloo rendezvous port
    (``get_free_port_below_ephemeral``), so the two never draw the same one.
    A port is handed out once per process: servers started side by side (the
    bench starts five) bind theirs only once they are up.
    """
    candidates = range(10000, min(22000, _ephemeral_low()))
    for port in random.SystemRandom().sample(candidates, min(200, len(candidates))):
        if port in _handed_out:  # given to a server that may not have bound it yet
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            _handed_out.add(port)
            return port
    with socket.socket() as s:  # no room below the range on this machine
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SGLangServer:
    def __init__(self, model: str, args: Sequence[str], env: Mapping[str, str], log_path: os.PathLike,
                 port: Optional[int] = None, python: str = sys.executable,
                 launcher: Sequence[str] = ("-m", "sglang.launch_server")):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log_path)
        self.cmd = [python, *launcher, "--model-path", model,
                    "--host", "127.0.0.1", "--port", str(self.port), *args]
        self.env = dict(env)
        self.proc: Optional[subprocess.Popen] = None

    def start(self, timeout: float = 300.0) -> "SGLangServer":
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(1.0)
        self.stop()
        raise TimeoutError(f"server not healthy after {timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self, chars: int = 6000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, grace: float = 30.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # stragglers in the group
        except (ProcessLookupError, PermissionError):
            pass
        if self.proc.poll() is None:
            self.proc.wait(timeout=10)
        self._log.close()
        self.proc = None

    def __enter__(self) -> "SGLangServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
