"""The counter model: spec-decode counters per engine, grown by drafts the way vLLM counts them
(a decode step: one draft, its proposed tokens, their accepted prefix; 1 + accepted emitted)."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

from exporter.core.dialects import SIMULATED_DIALECTS, default_path

DRAFT_COST = 0.1  # a drafted token's share of one forward pass, when steps take time


@dataclass
class EngineCounters:
    """Counters of one data-parallel rank, as ints."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    # Draft tokens proposed at each position (TensorRT-LLM's per-position drafted counter).
    drafted_per_pos: list[int] = field(default_factory=list)
    # The last add(): SGLang's gauges describe only the recent logging interval.
    last: tuple[int, int, int] = (0, 0, 0)  # drafts, draft tokens, accepted tokens


def check_count(name: str, value: object) -> None:
    """Raise ValueError naming the field unless value is a non-negative int."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")


@dataclass
class ServerModel:
    """A simulated server's settings and counters; `server.FakeServer` adds the page."""

    k: int = 3
    acceptance: float = 0.8
    engines: int = 1
    model_name: str = "fake/llama-3-8b"
    dialect: str = "vllm"
    spec_decode: bool = True
    ngram: bool = False
    histograms: bool = True
    seed: int = 0
    emit_created: bool = True
    # Extra model_name variants (LoRA adapters) of the non-spec-decode families, for big pages.
    lora_adapters: int = 0
    # "", "summary" or "detailed": vLLM's --per-request-spec-decode-metrics.
    per_request_metrics: str = ""
    # vLLM's --enable-per-request-metrics: each answer's timings (metrics.mean_itl_ms and more).
    request_timing: bool = False
    # Seconds one decode step takes an API request (0: none); a spec-decode step costs one
    # more DRAFT_COST of it per token drafted.
    step_seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        if not 0.0 <= self.acceptance <= 1.0:
            raise ValueError(f"acceptance must be within 0..1, got {self.acceptance}")
        if not 0.0 <= self.step_seconds <= 60.0:
            raise ValueError(f"step_seconds must be within 0..60, got {self.step_seconds}")
        if self.engines < 1:
            raise ValueError(f"engines must be >= 1, got {self.engines}")
        if self.dialect not in SIMULATED_DIALECTS:
            raise ValueError(f"dialect must be one of {', '.join(SIMULATED_DIALECTS)}, "
                             f"got {self.dialect!r}")
        self._rng = random.Random(self.seed)
        # The vLLM renderer's cache of the page around the spec-decode families.
        self.page_cache: dict[str, Any] = {}
        self.generation = 0
        self.created = 0.0
        self.in_flight = [0] * self.engines  # API requests decoding, per engine
        self.background = 0  # the background traffic's sequences decoding (app.py's)
        self.restart()

    def restart(self) -> None:
        """Restart the server: every counter back to 0, new _created timestamps."""
        self.engine_counters = [
            EngineCounters(accepted_per_pos=[0] * self.k, drafted_per_pos=[0] * self.k)
            for _ in range(self.engines)
        ]
        # A scraper detects a restart by a changed _created, so never reuse the old value.
        self.created = max(time.time(), self.created + 1e-6)
        self.generation += 1

    def add(self, engine: int, drafts: int, draft_tokens: int, accepted_per_pos: list[int]) -> None:
        """Add exact increments to one engine; accepted tokens grow by sum(accepted_per_pos)."""
        if (isinstance(engine, bool) or not isinstance(engine, int)
                or not 0 <= engine < self.engines):
            raise ValueError(f"engine must be within 0..{self.engines - 1}, got {engine!r}")
        check_count("drafts", drafts)
        check_count("draft_tokens", draft_tokens)
        if len(accepted_per_pos) > self.k:
            raise ValueError(f"accepted_per_pos has {len(accepted_per_pos)} positions, k={self.k}")
        for pos, count in enumerate(accepted_per_pos):
            check_count(f"accepted_per_pos[{pos}]", count)
        state = self.engine_counters[engine]
        state.drafts += drafts
        state.draft_tokens += draft_tokens
        for pos, count in enumerate(accepted_per_pos):
            state.accepted_per_pos[pos] += count
        # Every draft proposes position 0; the other tokens fill later ones, one per draft each.
        remaining = draft_tokens
        for pos in range(self.k):
            take = drafts if pos == 0 else min(drafts, max(remaining, 0))
            state.drafted_per_pos[pos] += take
            remaining -= take
        if drafts or draft_tokens:
            state.last = (drafts, draft_tokens, sum(accepted_per_pos))

    def _draft(self, conditional: list[float], most: int) -> tuple[int, int]:
        """One random draft: (proposed, accepted) with at most `most` tokens accepted."""
        proposed = self._rng.randint(1, self.k) if self.ngram else self.k
        accepted = 0
        while accepted < min(proposed, most) and self._rng.random() < conditional[accepted]:
            accepted += 1
        return proposed, accepted

    def _conditional(self) -> list[float]:
        # Position i, tried once i-1 is accepted, passes with acceptance**(i+1): later fall off.
        return [self.acceptance ** (i + 1) for i in range(self.k)]

    def simulate(self, drafts: int) -> None:
        """Run `drafts` random drafts spread over the engines, accepting a prefix of each."""
        check_count("drafts", drafts)
        conditional = self._conditional()
        tokens = [0] * self.engines
        by_length = [[0] * (self.k + 1) for _ in range(self.engines)]  # drafts per accepted L
        for _ in range(drafts):
            engine = self._rng.randrange(self.engines)
            proposed, accepted = self._draft(conditional, self.k)
            tokens[engine] += proposed
            by_length[engine][accepted] += 1
        for engine, lengths in enumerate(by_length):
            # A draft that accepted L tokens counts once at every position below L.
            per_pos = [sum(lengths[pos + 1 :]) for pos in range(self.k)]
            self.add(engine, sum(lengths), tokens[engine], per_pos)

    def totals(self) -> dict[str, Any]:
        """Return the counters summed over engines, per position keyed by int."""
        per_pos = {
            pos: sum(e.accepted_per_pos[pos] for e in self.engine_counters) for pos in range(self.k)
        }
        return {
            "num_drafts": sum(e.drafts for e in self.engine_counters),
            "num_draft_tokens": sum(e.draft_tokens for e in self.engine_counters),
            "num_accepted_tokens": sum(per_pos.values()),
            "accepted_per_pos": per_pos,
        }

    def plan_steps(self, tokens: int) -> list[tuple[int, int]]:
        """Decode steps emitting exactly `tokens` tokens (the last one cut, as at max_tokens)."""
        check_count("tokens", tokens)
        if not self.spec_decode:
            return [(0, 0)] * tokens  # one token a step: nothing drafted
        conditional = self._conditional()
        steps = []
        left = tokens
        while left > 0:
            proposed, accepted = self._draft(conditional, left - 1)
            steps.append((proposed, accepted))
            left -= 1 + accepted
        return steps

    def count_step(self, engine: int, proposed: int, accepted: int) -> None:
        """Count one decode step as vLLM does: one draft, its tokens, its accepted prefix."""
        if self.spec_decode:
            self.add(engine, 1, proposed, [1] * accepted)

    def running(self, engine: int) -> int:
        """Requests decoding on `engine` now (vLLM's num_requests_running): the API's in flight
        and its share of the background traffic's sequences."""
        share, extra = divmod(self.background, self.engines)
        return self.in_flight[engine] + share + (engine < extra)

    def pick_engine(self) -> int:
        """The data-parallel rank a new request lands on."""
        return self._rng.randrange(self.engines)

    @property
    def metrics_path(self) -> str:
        """Where this dialect's server serves Prometheus text."""
        return default_path(self.dialect)

    def created_or_none(self) -> float | None:
        """The _created value, or None when the page must not carry _created series."""
        return self.created if self.emit_created else None
