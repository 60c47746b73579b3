"""The one exception base of the exporter and its located subclasses."""


class ExporterError(Exception):
    """Base of every error the exporter raises on purpose."""


class ConfigError(ExporterError):
    """A config file that cannot be used; `problems` holds one `key.path: what is wrong` each."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        super().__init__(f"invalid config {source}: " + "; ".join(problems))


class RequestError(ExporterError):
    """Bad client input; `status` is the HTTP status the API answers with."""

    status = 400

    def __init__(self, message: str, status: int | None = None):
        if status is not None:
            self.status = status
        super().__init__(message)


class UnknownTargetError(RequestError):
    """A window named a target the config does not have."""

    def __init__(self, name: str, window: str, known: list[str]):
        super().__init__(
            f'unknown target "{name}" in window "{window}"; known: {", ".join(known) or "none"}'
        )


class UnknownWindowError(RequestError):
    """No window with that id exists."""

    status = 404

    def __init__(self, window_id: str):
        super().__init__(f'unknown window "{window_id}"')


class StoreError(ExporterError):
    """Durable state or a result file could not be written."""
