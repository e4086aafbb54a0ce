"""One root error, with subclasses that tell the caller what to do."""

from __future__ import annotations


class EsAgentsError(Exception):
    """Root of every error the framework raises on purpose."""


class ConfigError(EsAgentsError):
    """The settings or the environment are wrong; fix them (CLI exit code 2)."""


class Forbidden(EsAgentsError):
    """The database refused the configured role (least-privilege roles)."""


class NotFound(EsAgentsError):
    """No such run (CLI exit code 3)."""


class DecodeError(EsAgentsError):
    """Bytes that are not a message of ours; they go to the DLQ with this reason."""


class EncodeError(EsAgentsError):
    """A message that does not fit its schema: a bug in the code that made it."""


class FoldError(EsAgentsError):
    """An event that cannot follow the run's log: wrong run, gap, or bad transition."""


class ConflictError(EsAgentsError):
    """Someone else changed the run first; reload, never blind-retry."""


class FencedError(ConflictError):
    """This writer lost ownership of the run's partition; stop writing."""


class Unavailable(EsAgentsError):
    """A service did not answer in time; back off and try again (after
    ``retry_after`` seconds when the service said). CLI exit code 4."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class AppendError(EsAgentsError):
    """The broker did not acknowledge an append (or it could not be read back);
    nothing after it may act on it. CLI exit code 4, like ``Unavailable``."""


class VersionRefused(EsAgentsError):
    """The version gate refused to resume a run under the running code."""


class TerminalToolError(EsAgentsError):
    """A tool failed in a way that retrying cannot fix."""


class RetryableToolError(EsAgentsError):
    """A tool failed in a way that may pass later."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class EffectUnknown(EsAgentsError):
    """A side-effecting call was sent and its answer lost (the connection broke):
    the effect may have happened. The run pauses (``uncertain_effect``) for a
    person unless the tool's downstream honors its key or a lookup can tell."""


class RunError(EsAgentsError):
    """One run cannot go on: it ends ``failed`` with this kind, the worker goes on.

    ``kind`` is recorded in ``run_failed``: ``model_error``, ``model_unavailable``,
    ``planner_error``, ``reducer_error``, ``oversized_output``, ``worker_error``.
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class RateLimited(Unavailable):
    """The model said 429 (too many requests): wait ``retry_after`` seconds (when it
    said) -- a turn to wait for, not a failure of the call."""


class ModelError(EsAgentsError):
    """The model refused the request (a 4xx other than 408/429): retrying the same
    request cannot help."""


class InvalidInput(EsAgentsError, ValueError):
    """An input that is not JSON (a run's input, the input given to a paused run);
    nothing was sent."""


class OversizedEvent(EsAgentsError):
    """An event larger than the log accepts; nothing of its batch was appended."""


class PayloadUnavailable(EsAgentsError):
    """A claim-checked payload is missing from the object store or does not match
    its hash; the run pauses (``payload_unavailable``) until a person acts."""

    def __init__(self, message: str, run_id: str = "", step: int = 0, key: str = ""):
        super().__init__(message)
        self.run_id, self.step, self.key = run_id, step, key


class ProjectionIncomplete(EsAgentsError):
    """The projection keeps the bytes of a run's events only from its latest
    snapshot on: without a usable snapshot of this reducer version, the events
    before it are read from the log."""


class ProjectionUntrusted(EsAgentsError):
    """A run's projected events do not verify against the writer key or do not
    chain: they are not resumed from (the log is read instead)."""
