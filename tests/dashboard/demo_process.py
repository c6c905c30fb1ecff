"""`kvdoctor demo --scenario X` as a real process on free ports, for the end-to-end dashboard tests."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 60.0


@dataclass
class Demo:
    scenario: str
    dashboard: bool = True
    process: subprocess.Popen | None = None
    dashboard_url: str | None = None
    exporter_url: str | None = None
    engine_url: str | None = None
    started_at: float = 0.0
    url_printed_at: float = 0.0
    output: list[str] = field(default_factory=list)

    def start(self) -> Demo:
        args = [
            sys.executable,
            "-m",
            "kvdoctor",
            "demo",
            "--scenario",
            self.scenario,
            "--port",
            "0",
            "--status-every",
            "0",
        ]
        args += ["--dashboard-port", "0"] if self.dashboard else ["--no-dashboard"]
        self.started_at = time.monotonic()
        self.process = subprocess.Popen(
            args,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, args=(lines,), daemon=True).start()
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=0.5)
            except queue.Empty:
                if self.process.poll() is not None:
                    break
                continue
            words = line.split()
            if len(words) >= 2 and words[0] == "dashboard" and words[1].startswith("http"):
                self.dashboard_url = words[1]
                self.url_printed_at = time.monotonic()
            elif len(words) >= 2 and words[0] == "metrics":
                self.exporter_url = words[1].removesuffix("/metrics")
            elif len(words) >= 2 and words[0] == "engine":
                self.engine_url = words[1].removesuffix("/metrics")
            elif line.startswith("Ctrl-C to stop"):
                return self
        self.stop()
        raise RuntimeError(f"kvdoctor demo --scenario {self.scenario} did not start:\n" + "\n".join(self.output[-20:]))

    def _pump(self, lines: queue.Queue) -> None:
        for line in self.process.stdout:
            self.output.append(line.rstrip())
            lines.put(line.strip())

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()  # the demo stops its threads on SIGTERM; it starts no child processes
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)
