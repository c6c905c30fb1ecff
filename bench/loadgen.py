"""A light HTTP load generator for the /metrics benchmark (run in its own process).

``python -m bench.loadgen HOST PORT PATH --scrapers 16 --rounds 60 --gap 0.05`` opens one
connection per scraper and, each round, sends all scrapers' GETs at the same instant (aligned
scrapes: the worst case for latency), waits for every response, pauses ``--gap`` seconds and
repeats. Latency is send -> last body byte, reconnecting when the server closes the connection
(HTTP/1.0 servers). Raw asyncio sockets keep the client's own cost small. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time


async def _get(state: dict, host: str, port: int, request: bytes) -> float:
    started = time.perf_counter()
    if state.get("writer") is None:
        state["reader"], state["writer"] = await asyncio.open_connection(host, port)
    reader, writer = state["reader"], state["writer"]
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    headers = {}
    for line in head.decode("latin-1").split("\r\n")[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    if "content-length" in headers:
        await reader.readexactly(int(headers["content-length"]))
        keep = headers.get("connection", "").lower() != "close" and not head.startswith(b"HTTP/1.0")
    else:
        await reader.read()  # body until close
        keep = False
    elapsed = time.perf_counter() - started
    if not keep:
        writer.close()
        state["writer"] = None
    if not head.split(b" ", 2)[1].startswith(b"2"):
        raise RuntimeError(f"HTTP {head.split(b' ', 2)[1].decode()}")
    return elapsed


async def run(host: str, port: int, path: str, scrapers: int, rounds: int, gap: float) -> dict:
    request = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAccept-Encoding: identity\r\n\r\n".encode()
    states = [{} for _ in range(scrapers)]
    latencies: list[float] = []
    started = time.perf_counter()
    for _ in range(rounds):
        latencies += await asyncio.gather(*(_get(s, host, port, request) for s in states))
        if gap:
            await asyncio.sleep(gap)
    wall = time.perf_counter() - started
    for s in states:
        if s.get("writer") is not None:
            s["writer"].close()
    latencies.sort()

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000

    return {"n": len(latencies), "p50_ms": pct(0.50), "p99_ms": pct(0.99), "max_ms": latencies[-1] * 1000,
            "requests_per_s": len(latencies) / max(wall - gap * rounds, 1e-9)}


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
