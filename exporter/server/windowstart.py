"""What a window's start asks for, and the rules of starting one id again."""

from __future__ import annotations

from dataclasses import dataclass, field

from exporter.core.errors import RequestError
from exporter.core.isotime import iso_utc
from exporter.core.window import MAX_NAME, TargetRef, Window, check_window_id, new_window_id


@dataclass(frozen=True)
class StartRequest:
    """What a start asks for; targets already resolved to what the window remembers."""

    id: str | None
    name: str | None
    targets: list[TargetRef]
    labels: dict[str, str] = field(default_factory=dict)

    def window(self, now: float) -> Window:
        """The new (not yet durable) window."""
        window_id = check_window_id(self.id) if self.id is not None else new_window_id(now)
        name = self.name or window_id
        if len(name) > MAX_NAME:
            raise RequestError(f"name must be at most {MAX_NAME} characters")
        return Window(id=window_id, name=name, labels=dict(self.labels), started_at=now,
                      targets={t.name: t for t in self.targets})


def retried(existing: Window, asked: Window) -> Window:
    """The open window an identical start retries; 409 for any other start of a known id."""
    if existing.stopped_at is not None:
        raise RequestError(f'window "{existing.id}" was stopped at '
                           f"{iso_utc(existing.stopped_at)}; start a new id, or DELETE "
                           f"/api/v1/windows/{existing.id} first", status=409)
    if (existing.name, existing.labels, set(existing.targets)) != (
            asked.name, asked.labels, set(asked.targets)):
        raise RequestError(f'window "{existing.id}" is open with another name, targets or '
                           "labels; start a new id, or stop it first", status=409)
    return existing
