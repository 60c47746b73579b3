"""The one exception base of the exporter and its located subclasses."""

import errno


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

    def __init__(self, name: str, window: str | None, known: list[str]):
        # A start without an id has no window to name yet.
        where = f' in window "{window}"' if window else ""
        super().__init__(
            f'unknown target "{name}"{where}; known: {", ".join(known) or "none"}'
        )


class UnknownWindowError(RequestError):
    """No window with that id exists."""

    status = 404

    def __init__(self, window_id: str):
        super().__init__(f'unknown window "{window_id}"')


class StoreError(ExporterError):
    """Durable state or a result file could not be written."""


class ListenError(ExporterError):
    """An address the exporter, the demo or fake-vllm could not listen on; says what to do."""

    def __init__(self, address: str, exc: OSError, flag: str):
        if exc.errno == errno.EADDRINUSE:
            why = "address already in use"
            todo = f"stop what listens there, or choose another address with {flag}"
        elif exc.errno == errno.EACCES:
            why = "permission denied"
            todo = f"use a port above 1023, or choose another address with {flag}"
        else:
            why = exc.strerror or str(exc)
            todo = f"check the address, or choose another with {flag}"
        super().__init__(f"cannot listen on {address}: {why}; {todo}")
