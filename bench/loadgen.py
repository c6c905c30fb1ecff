"""A light HTTP load generator for the /metrics benchmark (run in its own process).

``python -m bench.loadgen HOST PORT PATH --scrapers 16 --rounds 60 --gap 0.05`` opens one
connection per scraper and, each round, sends all scrapers' GETs at the same instant (aligned
scrapes: the worst case for latency), waits for every response, pauses ``--gap`` seconds and
repeats. Latency is send -> last body byte, reconnecting when the server closes the connection
(HTTP/1.0 servers). Prints one JSON line.

The client's own cost is part of every latency it reports, so it is kept small: one asyncio
``Protocol`` per connection appending to a buffer and reading ``Content-Length`` once (the
streams API -- ``readuntil``/``readexactly`` and a task per read -- measured ~1.5x the p99 against
a bare server on a 2-core machine).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

_HEAD_END = b"\r\n\r\n"


class _Scraper(asyncio.Protocol):
    """One keep-alive connection; ``get()`` resolves to the seconds until the last body byte."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._buffer = bytearray()
        self._total: int | None = None  # head + body length, once the head is in
        self._waiter: asyncio.Future | None = None
        self._started = 0.0
        self._status = b""

    def connection_made(self, transport) -> None:
        self.transport = transport

    def get(self, request: bytes) -> asyncio.Future:
        self._buffer.clear()
        self._total = None
        self._waiter = asyncio.get_running_loop().create_future()
        self._started = time.perf_counter()
        self.transport.write(request)
        return self._waiter

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        if self._total is None:
            end = buffer.find(_HEAD_END)
            if end < 0:
                return
            head = bytes(buffer[:end]).lower()
            self._status = head.split(b" ", 2)[1]
            at = head.find(b"\r\ncontent-length:")
            if at < 0:
                self._total = -1  # the body ends when the server closes the connection
                return
            self._total = end + len(_HEAD_END) + int(head[at + 17 :].split(b"\r\n", 1)[0])
            if head.startswith(b"http/1.0") or b"\r\nconnection: close" in head:
                self.closed = True  # answered, then closed: reconnect before the next round
        if 0 <= self._total <= len(buffer):
            self._done()

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self._waiter is not None and not self._waiter.done():
            if self._total == -1:
                self._done()
            else:
                self._waiter.set_exception(ConnectionError(f"connection lost before the answer ended: {exc}"))

    def _done(self) -> None:
        if self._waiter.done():
            return
        if not self._status.startswith(b"2"):
            self._waiter.set_exception(RuntimeError(f"HTTP {self._status.decode()}"))
        else:
            self._waiter.set_result(time.perf_counter() - self._started)


async def _connect(host: str, port: int) -> _Scraper:
    _, scraper = await asyncio.get_running_loop().create_connection(_Scraper, host, port)
    return scraper


async def run(host: str, port: int, path: str, scrapers: int, rounds: int, gap: float) -> dict:
    request = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAccept-Encoding: identity\r\n\r\n".encode()
    clients = [await _connect(host, port) for _ in range(scrapers)]
    latencies: list[float] = []
    started = time.perf_counter()
    for _ in range(rounds):
        for i, client in enumerate(clients):
            if client.closed:  # not timed: a real scraper's reconnect is its own business
                clients[i] = await _connect(host, port)
        latencies += await asyncio.gather(*(c.get(request) for c in clients))
        if gap:
            await asyncio.sleep(gap)
    wall = time.perf_counter() - started
    for client in clients:
        if not client.closed:
            client.transport.close()
    latencies.sort()

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000

    return {
        "n": len(latencies),
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "max_ms": latencies[-1] * 1000,
        "requests_per_s": len(latencies) / max(wall - gap * rounds, 1e-9),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    parser.add_argument("path")
    parser.add_argument("--scrapers", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--gap", type=float, default=0.05)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args.host, args.port, args.path, args.scrapers, args.rounds, args.gap))))


if __name__ == "__main__":
    main()
