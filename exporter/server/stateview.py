"""One read-only, versioned view of the exporter's state: what /metrics, the JSON views and the
landing page read, instead of the service's parts."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from exporter.config.model import Config
from exporter.core.counting import LiveTrack
from exporter.core.kept import LastWindow, StoppedWindow
from exporter.core.window import Window
from exporter.server.targets import TargetState


@dataclass(frozen=True)
class StateView:
    """The state at one moment; `version` differs whenever anything in it may have changed.
    `targets_version` only when the targets or their configs (labels) do: what a cache of
    per-target text (the last window's gauges) is keyed on besides the window."""

    version: int
    now: float  # the exporter's clock when the view was taken
    targets_version: int
    config: Config
    targets: Mapping[str, TargetState]
    live: Mapping[str, LiveTrack]  # read with `over_span`, never fed
    open_windows: int
    last_window: LastWindow | None  # what the gauges read of the most recently stopped one
    windows: Callable[[], list[Window | StoppedWindow]]  # open and recent stopped, newest first
    with_series: Callable[[str], Window]  # a window with its per-scrape series
    reload_ok: bool
    reload_at: float
    discovery_up: Mapping[str, bool]  # per source
    discovery_errors: Mapping[str, str]
    ready: bool
    state_write_errors: int
    result_write_errors: int
