"""Start and stop a real ``python -m sglang.launch_server`` for tests and benchmarks.

The server runs in its own process group, so stopping it (SIGTERM to the
launcher, as SGLang expects, then SIGKILL to the group after a grace period)
never leaves a scheduler or detokenizer behind.  Its output goes to a log
file, which is quoted when the server fails to come up.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Mapping, Optional, Sequence


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SGLangServer:
    def __init__(self, model: str, args: Sequence[str], env: Mapping[str, str], log_path: os.PathLike,
                 port: Optional[int] = None, python: str = sys.executable,
                 launcher: Sequence[str] = ("-m", "sglang.launch_server")):
        self._chosen_port = port is None  # ours to change if it is taken
        self._launch = [python, *launcher, "--model-path", model, "--host", "127.0.0.1"]
        self._args = list(args)
        self._use_port(port or free_port())
        self.log_path = Path(log_path)
        self.env = dict(env)
        self.proc: Optional[subprocess.Popen] = None

    def _use_port(self, port: int) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.cmd = [*self._launch, "--port", str(port), *self._args]

    def start(self, timeout: float = 300.0, attempts: int = 3) -> "SGLangServer":
        """Launch and wait for /health. A port of our choosing can be taken
        while the server starts (it binds its HTTP port last, after its
        scheduler's gloo sockets have bound ephemeral ports of their own):
        then it starts again on another port, up to ``attempts`` times."""
        for attempt in range(attempts):
            try:
                return self._start_once(timeout)
            except RuntimeError:
                taken = "address already in use" in self.log_tail()
                if not (taken and self._chosen_port and attempt + 1 < attempts):
                    raise
                self.stop()
                self._use_port(free_port())
        raise AssertionError("unreachable")

    def _start_once(self, timeout: float) -> "SGLangServer":
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
