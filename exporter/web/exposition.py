"""The exporter's own /metrics, written straight from the state (prometheus_client's generic
path is too slow per sample): each target keeps its lines per family while its state object (and
live span) lives; a render builds the stale ones and joins them family by family."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.gc_collector import GCCollector
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.process_collector import ProcessCollector

from exporter import __version__
from exporter.core.counting import LiveTrack
from exporter.core.derive import acceptance_length, acceptance_ratio, position_ratios, span_figures
from exporter.core.kept import LastWindow
from exporter.core.loadbands import UNKNOWN, band_label
from exporter.core.snapshot import FILTERED, Counts, Field, SeriesKey, Snapshot
from exporter.server.stateview import StateView
from exporter.server.targets import TargetState
from exporter.web.families import (
    ACCEPTED,
    BUILD,
    DISCOVERY_UP,
    DRAFT_TOKENS,
    DRAFTS,
    DURATION,
    ENGINE_ACCEPTED,
    ENGINE_TOKENS,
    ERRORS,
    INTERVAL,
    LAST_INFO,
    LAST_LENGTH,
    LAST_POS_RATIO,
    LAST_RATIO,
    LAST_SCRAPE,
    LENGTH,
    LIVE_FAMILIES,
    LOAD_LENGTH,
    LOAD_RATIO,
    NO_LIVE,
    PER_POS,
    POS_RATIO,
    PRESENT,
    RATIO,
    READ_FILTERED,
    RELOAD_AT,
    RELOAD_OK,
    RESULT_ERRORS,
    STATE_ERRORS,
    TARGET_FAMILIES,
    UP,
    WINDOWS_OPEN,
    Family,
    escape,
    label_text,
    line,
    number,
    run_template,
    template,
)

_Point = tuple[float, Counts]


class _ModelPrefixes:
    """A model's sample prefixes; its per-position `template`s by the positions present."""

    __slots__ = ("drafts", "tokens", "accepted", "positions")

    def __init__(self, with_model: str):
        self.drafts = f"{DRAFTS.name}{{{with_model}}} "
        self.tokens = f"{DRAFT_TOKENS.name}{{{with_model}}} "
        self.accepted = f"{ACCEPTED.name}{{{with_model}}} "
        self.positions: dict[tuple[int, ...], str] = {}  # `template`s


class _Labels:
    """A target's sample prefixes (`name{labels} `), kept while its config object lives."""

    __slots__ = ("config", "text", "fixed", "up", "present", "filtered", "models", "live_positions")

    def __init__(self, name: str, state: TargetState):
        self.config = state.config
        self.text = label_text({"target": name} | state.config.labels)
        self.fixed = {f: f"{f.name}{{{self.text}}} "
                      for f in (UP, DURATION, LAST_SCRAPE, ERRORS, PRESENT, READ_FILTERED, RATIO,
                                LENGTH)}
        # Lines whose value is one of two: indexed by the bool.
        self.up, self.present, self.filtered = [(f"{self.fixed[f]}0.0\n", f"{self.fixed[f]}1.0\n")
                                                for f in (UP, PRESENT, READ_FILTERED)]
        self.models: dict[str, _ModelPrefixes] = {}
        self.live_positions: dict[tuple[int, ...], str] = {}  # `template`s

    def model(self, model: str) -> _ModelPrefixes:
        found = self.models.get(model)
        if found is None:
            found = self.models[model] = _ModelPrefixes(
                f'{self.text},model_name="{escape(model)}"')
        return found

    def positions(self, model: str | None, positions: tuple[int, ...]) -> str:
        """The `template` of `model`'s per-position counters, or of the live ratios (None)."""
        cache = self.live_positions if model is None else self.model(model).positions
        found = cache.get(positions)
        if found is None:
            head = (f"{POS_RATIO.name}{{{self.text}" if model is None
                    else f'{PER_POS.name}{{{self.text},model_name="{escape(model)}"')
            found = cache[positions] = template([f'{head},position="{pos}"}} '
                                                 for pos in positions])
        return found


def _engine_lines(labels: str, snapshot: Snapshot) -> tuple[str, str]:
    """Per-engine draft and accepted token lines: per-engine acceptance on the dashboard."""
    tokens: dict[str, float] = {}
    accepted: dict[str, float] = {}
    for key, value in snapshot.values.items():
        if key.field is Field.DRAFT_TOKENS:
            tokens[key.engine] = tokens.get(key.engine, 0.0) + value
        elif key.field is Field.ACCEPTED:
            accepted[key.engine] = accepted.get(key.engine, 0.0) + value

    def render(family: Family, sums: dict[str, float]) -> str:
        return "".join(f'{family.name}{{{labels},engine="{escape(engine)}"}} {number(v)}\n'
                       for engine, v in sorted(sums.items()))

    return render(ENGINE_TOKENS, tokens), render(ENGINE_ACCEPTED, accepted)


# Enum members bound once: `_model_sums` runs for every series of every target's scrape.
_DRAFTS, _DRAFT_TOKENS, _ACCEPTED, _PER_POS = (
    Field.DRAFTS, Field.DRAFT_TOKENS, Field.ACCEPTED, Field.PER_POS
)


class _Sums:
    """One model's counters summed over engines, as `Snapshot.by_model` sums them."""

    __slots__ = ("drafts", "tokens", "accepted", "per_position")

    def __init__(self) -> None:
        self.drafts = self.tokens = self.accepted = 0.0
        self.per_position: dict[int, float] = {}


def _model_sums(values: Mapping[SeriesKey, float]) -> tuple[dict[str, _Sums], bool]:
    """`Snapshot.by_model`'s sums (same floats, same order), and whether several engines."""
    sums: dict[str, _Sums] = {}
    first: str | None = None
    several = False
    for (field, model, engine, position, _), value in values.items():
        if engine != first:
            if first is None:
                first = engine
            else:
                several = True
        found = sums.get(model)
        if found is None:
            found = sums[model] = _Sums()
        if field is _DRAFTS:
            found.drafts += value
        elif field is _DRAFT_TOKENS:
            found.tokens += value
        elif field is _ACCEPTED:
            found.accepted += value
        elif field is _PER_POS:
            per_position = found.per_position
            per_position[position] = per_position.get(position, 0.0) + value
    return sums, several


def _scrape_lines(state: TargetState, labels: _Labels) -> tuple[str, ...]:
    """A target's lines of each family in `TARGET_FAMILIES`."""
    fixed = labels.fixed
    errors = f"{fixed[ERRORS]}{number(state.errors_total)}\n"
    last = state.last
    if last is None:
        return (labels.up[0], "", "", errors, "", "", "", "", "", "", "", "")
    duration = f"{fixed[DURATION]}{number(last.duration)}\n"
    at = f"{fixed[LAST_SCRAPE]}{number(last.at)}\n"
    snapshot = last.snapshot
    if snapshot is None:  # down: no counters
        return (labels.up[0], duration, at, errors, "", "", "", "", "", "", "", "")
    sums, several = _model_sums(snapshot.values)
    if len(sums) == 1:  # the usual page: one model, its four runs as they are
        [(model, counts)] = sums.items()
        drafts, tokens, accepted, per_pos = _model_lines(labels, model, counts)
    else:
        columns = zip(*[_model_lines(labels, model, sums[model]) for model in sorted(sums)],
                      strict=True)
        drafts, tokens, accepted, per_pos = ["".join(column) for column in columns] or [""] * 4
    engine_tokens = engine_accepted = ""
    if several:
        engine_tokens, engine_accepted = _engine_lines(labels.text, snapshot)
    # Unknown ("", a page not scraped by us) says nothing rather than "whole".
    filtered = labels.filtered[snapshot.read == FILTERED] if snapshot.read else ""
    return (labels.up[1], duration, at, errors, labels.present[snapshot.has_spec_decode], filtered,
            drafts, tokens, accepted, per_pos, engine_tokens, engine_accepted)


def _model_lines(labels: _Labels, model: str, counts: _Sums) -> tuple[str, str, str, str]:
    prefixes = labels.model(model)
    values = counts.per_position
    positions = tuple(sorted(values))
    return (f"{prefixes.drafts}{number(counts.drafts)}\n",
            f"{prefixes.tokens}{number(counts.tokens)}\n",
            f"{prefixes.accepted}{number(counts.accepted)}\n",
            run_template(labels.positions(model, positions),
                         tuple([values[pos] for pos in positions])))


class _TargetLines:
    """One target's lines for every per-scrape family; valid while its state object lives."""

    __slots__ = ("state", "labels", "lines", "live_key", "live")

    def __init__(self, state: TargetState, labels: _Labels):
        self.state = state
        self.labels = labels
        self.lines = _scrape_lines(state, labels)
        # The live track's (start, end) points behind `live`.
        self.live_key: tuple[_Point, _Point] | None = None
        self.live: tuple[str, ...] = NO_LIVE

    def live_lines(self, track: LiveTrack, now: float) -> tuple[str, ...]:
        """The live ratio, length, per-position and by-load lines; built again only when the
        span moved."""
        ends = track.span_ends(now)
        key = self.live_key
        if ends is None:
            self.live_key, self.live = None, NO_LIVE
        elif key is None or key[0] is not ends[0] or key[1] is not ends[1]:
            fixed = self.labels.fixed
            ratio, length, ratios = span_figures(ends[0][1], ends[1][1])
            self.live_key = ends
            self.live = (
                f"{fixed[RATIO]}{number(ratio)}\n" if ratio is not None else "",
                f"{fixed[LENGTH]}{number(length)}\n" if length is not None else "",
                run_template(self.labels.positions(None, tuple(ratios)),
                     tuple(ratios.values())),
                *_load_lines(self.labels.text, track.span_bands(now)),
            )
        return self.live


def _load_lines(labels: str, bands: Mapping[int, Counts]) -> tuple[str, str]:
    """The live ratio and length lines of each running-requests band with drafts in the span."""
    ratios, lengths = [], []
    for band in sorted(b for b in bands if b != UNKNOWN):
        with_band = f'{labels},band="{band_label(band)}"'
        if (ratio := acceptance_ratio(bands[band])) is not None:
            ratios.append(line(LOAD_RATIO.name, with_band, ratio))
        if (length := acceptance_length(bands[band])) is not None:
            lengths.append(line(LOAD_LENGTH.name, with_band, length))
    return "".join(ratios), "".join(lengths)


class MetricsWriter:
    """Renders /metrics from the state's read-only view; never awaits or scrapes."""

    def __init__(self, view: Callable[[], StateView], *, process_metrics: bool = True,
                 extra: Callable[[bool], list[str]] | None = None):
        self.view = view
        self.extra = extra  # families kept outside the state (the proxy's), given openmetrics
        self._cache: dict[str, _TargetLines] = {}
        self._last_key: tuple[LastWindow | None, int] | None = None
        self._last_lines: dict[Family, list[str]] = {}
        self._process = CollectorRegistry(auto_describe=False)
        if process_metrics:
            ProcessCollector(registry=self._process)
            GCCollector(registry=self._process)

    def _entry(self, name: str, state: TargetState) -> _TargetLines:
        """The target's lines for `state`, built now if they were built for an older one."""
        entry = self._cache.get(name)
        if entry is not None and entry.state is state:
            return entry
        labels = entry.labels if entry is not None else None
        if labels is None or labels.config is not state.config:
            labels = _Labels(name, state)
        fresh = self._cache[name] = _TargetLines(state, labels)
        # The live lines follow the track, not this scrape: kept unless their labels changed.
        if entry is not None and entry.labels is labels:
            fresh.live_key, fresh.live = entry.live_key, entry.live
        return fresh

    def prepare(self, chunk: int) -> Iterator[int]:
        """Build the stale targets' lines, yielding after every `chunk` (to let the loop run)."""
        view = self.view()
        live = view.live
        built = 0
        for name, state in list(view.targets.items()):
            entry = self._cache.get(name)
            track = live.get(name)
            if entry is not None and entry.state is state and (
                    track is None or entry.live_key == track.span_ends(view.now)):
                continue
            entry = self._entry(name, state)
            if track is not None:
                entry.live_lines(track, view.now)
            built += 1
            if built % chunk == 0:
                yield built
        if built % chunk:  # the last, partial chunk: the render comes in a turn of its own
            yield built

    def render(self, openmetrics: bool = False) -> bytes:
        """The whole exposition, in text format 0.0.4 or OpenMetrics 1.0 (formats.py)."""
        view = self.view()
        now = view.now
        header = functools.partial(Family.header, openmetrics=openmetrics)
        out: list[str] = [header(BUILD), line(BUILD.name, f'version="{__version__}"', 1.0)]
        entry = self._entry
        targets = [entry(name, state) for name, state in view.targets.items()]
        if len(self._cache) > len(targets):  # targets gone from the config leave the cache
            self._cache = {name: self._cache[name] for name in view.targets}
        live_tracks = view.live
        live = [e.live_lines(live_tracks[e.state.config.name], now) for e in targets]
        # Each family's lines together, as the format wants: the per-target blocks transposed.
        for families, blocks in ((TARGET_FAMILIES, [e.lines for e in targets]),
                                 (LIVE_FAMILIES, live)):
            columns = list(zip(*blocks, strict=True)) or [()] * len(families)
            _extend(out, dict(zip(families, columns, strict=True)), header)
        _extend(out, self._last_window(view), header)
        for family, value in ((WINDOWS_OPEN, view.open_windows), (RELOAD_OK, view.reload_ok),
                              (RELOAD_AT, view.reload_at), (INTERVAL, view.config.scrape_interval),
                              (STATE_ERRORS, view.state_write_errors),
                              (RESULT_ERRORS, view.result_write_errors)):
            out += [header(family), line(family.name, "", value)]
        if view.discovery_up:
            out.append(header(DISCOVERY_UP))
            out.extend(
                line(DISCOVERY_UP.name, label_text({"source": name}), 1.0 if up else 0.0)
                for name, up in view.discovery_up.items()
            )
        if self.extra is not None:
            out += self.extra(openmetrics)
        # prometheus_client's own OpenMetrics renderer ends with the `# EOF` that closes the whole.
        process = (openmetrics_latest if openmetrics else generate_latest)(self._process)
        # Joined as text, then encoded once: each copy of the whole is megabytes.
        out.append(process.decode())
        return "".join(out).encode()

    def _last_window(self, view: StateView) -> dict[Family, list[str]]:
        # Changes only when a window stops or the targets' set or labels change: keyed on both.
        window = view.last_window
        key = self._last_key
        if key is not None and key[0] is window and key[1] == view.targets_version:
            return self._last_lines
        out: dict[Family, list[str]] = {LAST_RATIO: [], LAST_LENGTH: [], LAST_POS_RATIO: [],
                                        LAST_INFO: []}
        if window is not None:
            out[LAST_INFO].append(line(
                LAST_INFO.name, label_text({"id": window.id, "name": window.name}),
                float(window.stopped_at)))
        for name, increase in window.increases.items() if window is not None else ():
            state = view.targets.get(name)
            labels = label_text({"target": name} | (state.config.labels if state else {}))
            # A gauge with no drafts behind it is absent, not 0.
            if (value := acceptance_ratio(increase)) is not None:
                out[LAST_RATIO].append(line(LAST_RATIO.name, labels, value))
            if (value := acceptance_length(increase)) is not None:
                out[LAST_LENGTH].append(line(LAST_LENGTH.name, labels, value))
            for pos, value in position_ratios(increase).items():
                out[LAST_POS_RATIO].append(
                    line(LAST_POS_RATIO.name, f'{labels},position="{pos}"', value))
        self._last_key, self._last_lines = (window, view.targets_version), out
        return out


def _extend(out: list[str], families: Mapping[Family, Sequence[str]],
            header: Callable[[Family], str]) -> None:
    for family, lines in families.items():
        out.append(header(family))
        out.extend(lines)

