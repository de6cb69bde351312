"""A real ``redis-server`` for the tests, on a free localhost port.

Started without persistence (a restart is an empty broker, the hardest case
for catching up), optionally with a password; ``stop()`` kills it,
``start()`` brings it back on the same port.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Optional

from lookahead.validate.server import free_port


def redis_server_binary() -> Optional[str]:
    return shutil.which("redis-server")


class RedisServer:
    def __init__(self, workdir: Path, password: Optional[str] = None, port: Optional[int] = None):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.password = password
        self.port = port or free_port()
        self.proc: Optional[subprocess.Popen] = None

    def url(self, db: int = 0, password: Optional[str] = None) -> str:
        password = self.password if password is None else password
        auth = f"default:{password}@" if password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/{db}"

    def start(self, timeout: float = 20.0) -> "RedisServer":
        binary = redis_server_binary()
        if binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", str(self.workdir), "--logfile", str(self.workdir / "redis.log")]
        if self.password:
            args += ["--requirepass", self.password]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}: "
                                   f"{(self.workdir / 'redis.log').read_text(errors='replace')[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server did not listen on port {self.port} within {timeout} s")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None

    def client(self):
        import redis

        return redis.Redis.from_url(self.url())

    def __enter__(self) -> "RedisServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
