"""The simulated engine: a vLLM-V1-like scheduler stepping over the ledger's roofline.

One engine step (what vLLM calls a scheduler iteration) is simulated at a time:

1. The scheduler serves running requests oldest first (one decode token each, or the next chunk
   of an unfinished prefill) within ``max_num_batched_tokens``. When a request needs a KV block and
   none is free, the newest running request is preempted: its blocks are freed and it goes back
   to the front of the queue to be recomputed (vLLM V1 preempts by recompute). Only then, and
   only if nothing was preempted, waiting requests are admitted first come first served, while
   their whole prompt fits with a small watermark left free for decode growth (what vLLM's V0
   block manager did; V1 allocates chunk by chunk and has no watermark, which preempts more).
2. The step's cost is the ledger's roofline (roofline.py): the HBM bytes and FLOPs of the
   scheduled tokens, KV loaded from the CPU tier over PCIe, and the host's overhead on top.
3. Time moves by the step's duration; every decode token observes its inter-token latency (a
   request resumed after preemption observes the whole stall, which is what bends the ITL curve
   into a knee), finished requests observe their request histograms.

The engine keeps vLLM's own counters and histograms (cumulative, with vLLM's bucket boundaries)
in ``VllmStats`` (vllm_metrics.py); the GPU's cumulative DRAM bytes, SM-busy seconds and PCIe bytes in ``GpuCounters``
(the simulated GPU collector turns two readings into GPM-style ratios, as NVML GPM does).

Requests sent to the engine's API (``submit``; serving.py streams their tokens) run beside the
scenario's clients and outlive a scenario switch.

A queue behind the workload (``queue``: scenarios.py's ``with_queue``) is the same physics: more
clients than the workload's sequence limit admits (for ``growing``, more of them joining every
second), so the running batch is the workload's own and the rest wait first come first served.

Deterministic: all randomness comes from one ``random.Random(seed)``, and the state at a time
depends only on the seed, the start time, when scenarios were switched and what was submitted,
not on how often it was read. Time is whatever the injected ``clock`` says (``time.time`` by default).
"""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from .deployment import EngineConfig
from .kv_blocks import KvBlocks
from .requests import API_EPOCH, Request
from .roofline import GpuCounters, StepLoad, step_cost
from .scenarios import CYCLE, CYCLE_PERIOD_SECONDS, QUEUE_NONE, Scenario, check_queue, scenario_at, with_queue
from .vllm_metrics import VllmStats


@dataclass
class EngineState:
    """An instant of the engine, as its gauges would read."""

    time: float
    scenario: str
    queue: str
    running: int
    waiting: int
    kv_usage: float
    used_blocks: int


class Simulation:
    """The simulated engine and its GPU. Thread-safe: every public method takes the lock.

    ``warmup`` seconds of simulated traffic are run at construction, so the first scrape already
    shows the scenario's steady state (as if the engine had been serving for a while).
    """

    def __init__(
        self,
        scenario: str = "healthy",
        seed: int = 0,
        config: EngineConfig | None = None,
        clock: Callable[[], float] = time.time,
        warmup: float = 20.0,
        cycle_period: float = CYCLE_PERIOD_SECONDS,
        queue: str = QUEUE_NONE,
    ):
        self.config = config or EngineConfig()
        if self.config.num_gpu_blocks < 2:
            raise ValueError(f"{self.config.shape.name} leaves no room for a KV cache on {self.config.gpu.name}")
        self.seed = seed
        self.cycle_period = cycle_period
        self._clock = clock
        self._lock = threading.RLock()
        self._rng = random.Random(seed)

        self.started = clock()  # wall time the scenario clock counts from (the cycle starts here)
        self.now = self.started - max(0.0, warmup)
        self.created = self.now  # what the engine reports as its metrics' creation time
        self.stats = VllmStats.new()
        self.gpu = GpuCounters(time=self.now)

        cfg = self.config
        self._kv_bytes = cfg.kv_bytes_per_token
        self.blocks = KvBlocks.for_config(cfg)
        self.running: list[Request] = []
        self.waiting: deque[Request] = deque()
        self._next_id = 0
        self._epoch = 0
        self._in_flight = 0  # closed-loop clients' outstanding requests of this epoch
        self._next_arrival: float | None = None
        self._selection = scenario
        self._selected_at = self.started
        self._queue = check_queue(queue)
        self._active = with_queue(scenario_at(scenario, 0.0, cycle_period), self._queue)
        self._first_wave = 0  # closed-loop requests still to create with spread-out lengths
        self._preempted_this_step = False
        self.steps = 0
        self._switch(self._active)
        self.advance_to(clock())

    # ------------------------------------------------------------------ public
    @property
    def scenario(self) -> str:
        """The selected scenario name (``cycle`` while cycling)."""
        return self._selection

    @property
    def queue(self) -> str:
        """The queue behind every scenario (``none``, ``steady``, ``growing``)."""
        return self._queue

    @property
    def active_scenario(self) -> Scenario:
        return self._active

    def set_scenario(self, name: str, queue: str | None = None) -> None:
        """Switch the workload now (and the queue behind it, when given; else it stays): the
        previous clients disconnect (their requests are aborted) and the new ones start sending."""
        scenario_at(name, 0.0)  # validates the name
        if queue is not None:
            check_queue(queue)
        with self._lock:
            self.advance_to(self._clock())
            self._selection = name
            self._selected_at = self.now
            self._queue = queue if queue is not None else self._queue
            self._switch(with_queue(scenario_at(name, 0.0, self.cycle_period), self._queue))

    def advance_to(self, t: float) -> None:
        """Simulate engine steps until time ``t`` (the last step may end a little after it)."""
        with self._lock:
            while self.now < t:
                self._follow_schedule()
                self._arrivals()
                if not self.running and not self.waiting:
                    self._idle_until(t)
                    continue
                self._step()

    def sync(self) -> None:
        """Advance to the clock's now."""
        self.advance_to(self._clock())

    def state(self) -> EngineState:
        with self._lock:
            used = self.blocks.used
            return EngineState(
                self.now,
                self._active.name,
                self._queue,
                len(self.running),
                len(self.waiting),
                used / self.blocks.usable,
                used,
            )

    def gpu_reading(self) -> GpuCounters:
        """A copy of the cumulative GPU counters (advance first with ``sync``)."""
        with self._lock:
            g = self.gpu
            return GpuCounters(g.time, g.dram_bytes, g.sm_active_seconds, g.pcie_rx_bytes, g.pcie_tx_bytes)

    def submit(self, prompt_tokens: int, output_tokens: int) -> Request:
        """Queue a request sent to the engine's API; it runs until ``output_tokens`` are made."""
        with self._lock:
            self.advance_to(self._clock())
            self._next_id += 1
            req = Request(self._next_id, API_EPOCH, self.now, prompt_tokens, output_tokens, 0, 0)
            self.waiting.append(req)
            return req

    def cancel(self, req: Request) -> None:
        """The client went away: drop ``req`` wherever it is (a no-op once it finished)."""
        with self._lock:
            if req in self.running:
                self.running.remove(req)
                self.blocks.release(req)
            elif req in self.waiting:
                self.waiting.remove(req)

    def snapshot(self) -> tuple[EngineState, VllmStats]:
        """The gauges and a deep copy of the counters, consistent with each other."""
        with self._lock:
            return self.state(), self.stats.copy()

    # ------------------------------------------------------------------ workload
    def _follow_schedule(self) -> None:
        if self._selection != CYCLE:
            return
        due = scenario_at(CYCLE, self.now - self._selected_at, self.cycle_period)
        if due.name != self._active.name:
            self._switch(with_queue(due, self._queue))

    def _switch(self, scenario: Scenario) -> None:
        aborted = [r for r in (*self.running, *self.waiting) if r.epoch != API_EPOCH]
        for req in self.running:
            if req.epoch != API_EPOCH:
                self.blocks.release(req)
        self.running = [r for r in self.running if r.epoch == API_EPOCH]
        self.waiting = deque(r for r in self.waiting if r.epoch == API_EPOCH)
        if aborted:
            self.stats.add_labelled("vllm:request_success", "abort", len(aborted))
        self._epoch += 1
        self._in_flight = 0
        self._active = scenario
        self._next_arrival = self.now if scenario.arrival_rate > 0 else None
        self._first_wave = scenario.clients if scenario.arrival_rate <= 0 else 0
        self._clients = scenario.clients
        self._joined = 0  # clients that came since the switch (``clients_joining``)
        self._switched_at = self.now

    def _seq_limit(self) -> int:
        """The most requests running at once: the deployment's limit, or the workload's below it."""
        limit = self.config.max_num_seqs
        return min(limit, self._active.max_running) if self._active.max_running > 0 else limit

    def _new_request(self, at: float) -> Request:
        s = self._active
        rng = self._rng

        def draw(mean: int) -> int:
            return max(1, round(mean * (1.0 + rng.uniform(-s.length_jitter, s.length_jitter))))

        prompt = min(draw(s.prompt_tokens), self.config.max_model_len - 1)
        output = draw(s.output_tokens)
        if self._first_wave:
            # Clients that all start at the same instant would finish in lockstep for the rest
            # of the run; a real fleet never is, so the first wave's answers are spread out.
            self._first_wave -= 1
            output = max(1, int(output * rng.uniform(0.05, 1.0)))
        output = max(1, min(output, self.config.max_model_len - prompt))
        bs = self.config.block_size
        shared = min(s.shared_prefix_tokens, prompt - 1) // bs * bs  # whole blocks are shared
        host = max(0, min(s.host_prefix_tokens, prompt - 1 - shared))
        self._next_id += 1
        return Request(self._next_id, self._epoch, at, prompt, output, shared, host)

    def _arrivals(self) -> None:
        s = self._active
        if s.arrival_rate > 0:
            while self._next_arrival is not None and self._next_arrival <= self.now:
                if len(self.waiting) >= s.max_waiting:
                    self.stats.add_labelled("vllm:admission_rejections", "max_num_queued_reqs", 1)
                else:
                    self.waiting.append(self._new_request(self._next_arrival))
                self._next_arrival += self._rng.expovariate(s.arrival_rate)
        else:
            if s.clients_joining > 0:  # new clients come and stay; one the queue limit refuses goes away
                due = int((self.now - self._switched_at) * s.clients_joining) - self._joined
                for _ in range(max(0, due)):
                    self._joined += 1
                    if len(self.waiting) >= s.max_waiting:
                        self.stats.add_labelled("vllm:admission_rejections", "max_num_queued_reqs", 1)
                    else:
                        self._clients += 1
            while self._in_flight < self._clients:
                self.waiting.append(self._new_request(self.now))
                self._in_flight += 1

    def _idle_until(self, t: float) -> None:
        """Nothing to run: time passes with the GPU idle, until ``t`` or the next arrival."""
        nxt = self._next_arrival
        self.now = min(t, nxt) if nxt is not None and nxt > self.now else max(self.now, t)
        self.gpu.time = self.now

    # ------------------------------------------------------------------ preemption
    def _make_room(self, req: Request, computed: int) -> bool:
        """Allocate for ``req``, preempting the newest running requests until it fits; False if
        ``req`` itself had to go (it was the newest)."""
        while not self.blocks.allocate(req, computed):
            victim = self.running[-1]
            self._preempt(victim)
            if victim is req:
                return False
        return True

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self.blocks.release(req)
        req.preemptions += 1
        req.target = req.prompt + req.generated  # recompute everything it had
        self.waiting.appendleft(req)
        self.stats.add("vllm:num_preemptions", 1)
        self._preempted_this_step = True

    # ------------------------------------------------------------------ one step
    def _step(self) -> None:
        cfg = self.config
        s = self._active
        budget = cfg.max_num_batched_tokens
        scheduled: list[tuple[Request, int]] = []
        self._preempted_this_step = False

        # 1. running requests, oldest first; preempt the newest when blocks run out
        bs = cfg.block_size
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            if req.computed < req.target:  # an unfinished prefill: its next chunk
                n = min(req.target - req.computed, budget)
                room = self._make_room(req, req.computed + n)
            else:  # decode: one token, a new block only when the last one is full
                n = 1
                room = (req.computed - req.shared) % bs != 0 or self._make_room(req, req.computed + 1)
            if not room:
                break  # it preempted itself: it was the newest, nothing runs after it
            scheduled.append((req, n))
            budget -= n
            i += 1

        # 2. admit waiting requests, first come first served (not in a step that had to preempt:
        #    the pool is exhausted). Like vLLM's V0 block manager, admission reserves the whole
        #    prompt and keeps a watermark of blocks free for the running requests' decode growth.
        load_bytes = 0.0
        if not self._preempted_this_step:
            limit = self._seq_limit()
            while self.waiting and budget > 0 and len(self.running) < limit:
                req = self.waiting[0]
                start = req.shared + req.host  # found in the prefix cache / loaded from the CPU tier
                n = min(req.target - start, budget)
                if not self.blocks.admits(req):
                    break
                self.blocks.allocate(req, req.target)
                self.waiting.popleft()
                req.computed = start
                load_bytes += req.host * self._kv_bytes
                if req.first_scheduled is None:
                    req.first_scheduled = self.now
                self._count_admission(req)
                self.running.append(req)
                scheduled.append((req, n))
                budget -= n

        if not scheduled:
            # nothing fits and nothing runs: wait for the next arrival (or a little while)
            self._idle_until(self.now + 0.01)
            return

        # 3. cost, from the ledger's roofline
        kv_read_tokens = 0
        attended = 0.0
        prefill_tokens = 0
        for req, n in scheduled:
            kv_read_tokens += req.computed + n
            attended += n * (req.computed + n / 2.0)
            if req.computed < req.target:
                prefill_tokens += n
        load = StepLoad(
            sequences=len(scheduled),
            new_tokens=cfg.max_num_batched_tokens - budget,
            prefill_tokens=prefill_tokens,
            kv_read_tokens=kv_read_tokens,
            attended=attended,
            host_load_bytes=load_bytes,
        )
        cost = step_cost(cfg, s, load, self._kv_bytes, self._rng)

        # 4. the GPU's view and the engine's own estimates
        self.gpu.add_step(load, cost)
        if load_bytes:
            self.stats.add_labelled("vllm:kv_offload_total_bytes", "CPU_to_GPU", load_bytes)
            self.stats.add_labelled("vllm:kv_offload_total_time", "CPU_to_GPU", cost.transfer_seconds)
        self.stats.add("vllm:estimated_flops_per_gpu", cost.flops)
        self.stats.add("vllm:estimated_read_bytes_per_gpu", cost.hbm_bytes)
        self.stats.add("vllm:estimated_write_bytes_per_gpu", load.new_tokens * self._kv_bytes)
        self.stats.observe("vllm:iteration_tokens_total", load.new_tokens)

        step_start = self.now
        self.now += cost.seconds
        self.gpu.time = self.now
        self.steps += 1
        self._finish_step(scheduled, step_start)

    def _count_admission(self, req: Request) -> None:
        st = self.stats
        local_hit = req.shared
        st.add("vllm:prefix_cache_queries", req.target)
        st.add("vllm:prefix_cache_hits", local_hit)
        # the offloading connector is configured: what the device cache misses is looked up there
        st.add("vllm:external_prefix_cache_queries", req.target - local_hit)
        st.add("vllm:external_prefix_cache_hits", req.host)
        if req.counted:
            return  # a resumed request: vLLM does not count recomputed prompt tokens again
        req.counted = True
        computed = req.prompt - req.shared - req.host
        st.add("vllm:prompt_tokens", req.prompt)
        st.add_labelled("vllm:prompt_tokens_by_source", "local_compute", computed)
        st.add_labelled("vllm:prompt_tokens_by_source", "local_cache_hit", req.shared)
        st.add_labelled("vllm:prompt_tokens_by_source", "external_kv_transfer", req.host)
        st.add("vllm:prompt_tokens_cached", req.shared + req.host)
        st.add_labelled("vllm:prompt_tokens_cached_by_source", "device", req.shared)
        st.add_labelled("vllm:prompt_tokens_cached_by_source", "host", req.host)
        st.observe("vllm:request_queue_time_seconds", self.now - req.arrival)
        st.observe("vllm:request_prefill_kv_computed_tokens", computed)

    def _finish_step(self, scheduled: list[tuple[Request, int]], step_start: float) -> None:
        now = self.now
        st = self.stats
        itl = st.histograms["vllm:inter_token_latency_seconds"]
        same_step = 0  # decode tokens whose previous token came at the end of the previous step
        tokens = 0
        finished: list[Request] = []
        for req, n in scheduled:
            was_prefilling = req.computed < req.target
            req.computed += n
            if req.computed < req.target:
                continue  # more prefill chunks to go: no token this step
            req.target = req.computed
            if req.first_token is None:  # the prefill just finished: the first token
                req.first_token = now
                st.observe("vllm:time_to_first_token_seconds", now - req.arrival)
            elif not was_prefilling and req.last_token == step_start:
                same_step += 1
            else:  # resumed after a preemption (or after waiting out a step): the whole stall
                itl.observe(now - req.last_token)
            req.last_token = now
            req.generated += 1
            tokens += 1
            if req.generated >= req.output:
                finished.append(req)
        itl.observe(now - step_start, same_step)
        st.add("vllm:generation_tokens", tokens)
        for req in finished:
            self._finish(req)

    def _finish(self, req: Request) -> None:
        now = self.now
        st = self.stats
        self.running.remove(req)
        self.blocks.release(req)
        if req.epoch == self._epoch and self._active.arrival_rate <= 0:
            self._in_flight -= 1
        st.add_labelled("vllm:request_success", "length", 1)
        st.observe("vllm:e2e_request_latency_seconds", now - req.arrival)
        st.observe("vllm:request_inference_time_seconds", now - req.first_scheduled)
        st.observe("vllm:request_prefill_time_seconds", req.first_token - req.first_scheduled)
        st.observe("vllm:request_decode_time_seconds", now - req.first_token)
        st.observe("vllm:request_prompt_tokens", req.prompt)
        st.observe("vllm:request_generation_tokens", req.generated)
        st.observe("vllm:request_max_num_generation_tokens", req.output)
        st.observe("vllm:request_params_n", 1)
        st.observe("vllm:request_params_max_tokens", req.output)
        st.observe("vllm:request_num_preemptions", req.preemptions)
        if req.generated > 1:
            st.observe("vllm:request_time_per_output_token_seconds", (now - req.first_token) / (req.generated - 1))
        if self._active.offload_store:
            # the offloading connector writes the request's new KV to the CPU tier (async, hidden)
            stored = (req.prompt + req.generated - req.host - req.shared) * self._kv_bytes
            st.add_labelled("vllm:kv_offload_total_bytes", "GPU_to_CPU", stored)
            st.add_labelled("vllm:kv_offload_total_time", "GPU_to_CPU", self.config.host_copy_seconds(stored))
            self.gpu.pcie_tx_bytes += stored
