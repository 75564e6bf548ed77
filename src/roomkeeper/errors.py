"""The one exception tree of roomkeeper.

::

    RoomkeeperError                 base of everything roomkeeper raises on purpose
    ├── UsageError                  a person or caller gave a value we cannot use
    │   ├── SizeError               a size such as ``600M`` could not be read
    │   ├── UnwritablePlaceError    a directory roomkeeper must write to refuses writes
    │   └── UnrunnableError         valid, but this machine cannot run it (``reason``)
    │       └── WorktreeError      a job's git worktree cannot be made (``reason``, ``repo``)
    ├── KernelFileError             a kernel file did not have the shape we expect
    ├── LaunchError                 a managed process could not be started (``job_id``)
    ├── SuspendError                a managed tree could not be suspended (``job_id``)
    ├── QueueFullError              a submission met a bound (refused, not queued)
    ├── UnknownJobError             no job has the id asked for (``job_id``)
    ├── CallStateError              a registered call's state does not allow this (``call_id``)
    ├── NotEndedError               work still live or in doubt cannot be removed (``reason``)
    ├── StateConflictError          the job's state forbids this now (``work_id``, ``reason``)
    ├── AlreadyEndedError           the lease asked about has already ended (``lease_id``)
    ├── PersistenceError            the journal could not save (disk full, I/O error)
    │   └── SaveTimeoutError        the journal did not answer within a save's deadline
    ├── NoGatewayError              no gateway answers for this ROOMKEEPER_HOME
    └── GatewayError                the gateway refused a client's request (``status``, ``reason``)
        ├── NoRoom                  no room for the lease (the guard's ``reason``, ``summary``)
        ├── QueueFull               a bound was reached; nothing was queued or granted
        ├── NotFound                no job, lease or call has that id
        ├── Unauthorized            the token is missing or wrong
        └── GatewayUnavailable      no answer, or a 503: ask again later

Readers never let ``KernelFileError`` or ``OSError`` escape to the caller:
they translate both, at one boundary in :mod:`roomkeeper.kernel.resources`, into a
reading marked *unknown* with a reason.  Exceptions carry the fields a caller
needs to act on them, not only a message.
"""

from __future__ import annotations

import logging
import threading

_log = logging.getLogger("roomkeeper")


class RoomkeeperError(Exception):
    """Base class of every error roomkeeper raises on purpose."""


class UsageError(RoomkeeperError, ValueError):
    """A value given by a person or a caller cannot be used.

    Attributes:
        name: what the value was for (a flag, a variable, an argument).
        value: the text or value that was given.
    """

    def __init__(self, message: str, *, name: str = "", value: object = None) -> None:
        super().__init__(message)
        self.name = name
        self.value = value


class SizeError(UsageError):
    """A size such as ``600M``, ``1.5G`` or ``512K`` could not be read."""


class KernelFileError(RoomkeeperError):
    """A kernel file's text does not have the shape the parser expects.

    Attributes:
        what: which file it was, by its kernel name (``memory.stat``).
        detail: what was wrong with it.
    """

    def __init__(self, what: str, detail: str) -> None:
        super().__init__(f"{what}: {detail}")
        self.what = what
        self.detail = detail


class LaunchError(RoomkeeperError):
    """A managed process could not be started: nothing of it is left running.

    Attributes:
        job_id: the job whose launch failed.
        reason: what was wrong (a missing executable, a bad working directory...).
    """

    def __init__(self, job_id: str, reason: str) -> None:
        super().__init__(f"job {job_id!r} could not start: {reason}")
        self.job_id = job_id
        self.reason = reason


class SuspendError(RoomkeeperError):
    """A managed process tree could not be suspended: it was let go on as it was.

    Attributes:
        job_id: the job whose tree would not stop.
        reason: what did not stop, or what could not be written.
    """

    def __init__(self, job_id: str, reason: str) -> None:
        super().__init__(f"job {job_id!r} could not be suspended: {reason}")
        self.job_id = job_id
        self.reason = reason


class QueueFullError(RoomkeeperError):
    """A submission was refused at once because a bound was reached.

    Attributes:
        reason: ``queue_full`` or ``owner_queue_full`` (or ``closing``, ``duplicate``) for
            jobs; ``leases_full`` or ``owner_leases_full`` for leases.
        owner: the owner whose submission it was.
    """

    def __init__(self, message: str, *, reason: str, owner: str = "") -> None:
        super().__init__(message)
        self.reason = reason
        self.owner = owner


class UnknownJobError(RoomkeeperError, KeyError):
    """No job has the id asked for.

    Attributes:
        job_id: the id that was asked for.
    """

    def __init__(self, message: str, *, job_id: str) -> None:
        super().__init__(message)
        self.job_id = job_id

    def __str__(self) -> str:
        return str(self.args[0])


class PersistenceError(RoomkeeperError):
    """The journal could not save something; it is reported, never presented as saved."""


class SaveTimeoutError(PersistenceError):
    """The journal did not answer within a save's deadline (a slow or hung disk).

    The write is still queued and may land later: the caller says what happens to it then.
    """


class CallStateError(RoomkeeperError):
    """A registered call is not in a state that allows this; the message says which and why.

    Attributes:
        call_id: the call asked about (empty where the caller did not say).
    """

    def __init__(self, message: str, *, call_id: str = "") -> None:
        super().__init__(message)
        self.call_id = call_id


class NotEndedError(RoomkeeperError):
    """A job or call cannot be removed yet: it is live, or its effect is in doubt.

    Attributes:
        work_id: the job or call asked about.
        reason: ``not_ended`` (cancel it, or let it end, first) or ``in_doubt`` (resolve it
            first: removing it would forget work whose effect nobody knows).
    """

    def __init__(self, message: str, *, work_id: str, reason: str) -> None:
        super().__init__(message)
        self.work_id = work_id
        self.reason = reason


class StateConflictError(RoomkeeperError):
    """The request is valid, but the state of the job it names forbids it now (a 409, not
    a malformed request).

    Attributes:
        work_id: the job asked about.
        reason: ``not_uncertain``: only an uncertain job can be resolved.
    """

    def __init__(self, message: str, *, work_id: str, reason: str) -> None:
        super().__init__(message)
        self.work_id = work_id
        self.reason = reason


class NoGatewayError(RoomkeeperError):
    """No gateway answers for this ROOMKEEPER_HOME; the message says how to start one."""


class UnwritablePlaceError(UsageError):
    """A directory roomkeeper must write to (ROOMKEEPER_HOME, a logs directory) cannot be
    written; the message names it, why, and how to choose another place.

    Attributes:
        path: the directory.
    """

    def __init__(self, message: str, *, path: str, name: str = "") -> None:
        super().__init__(message, name=name, value=path)
        self.path = path


class UnrunnableError(UsageError):
    """A request valid by the API's schema that this machine cannot run: its directory or
    command does not exist here, or it could never fit in the container.

    Attributes:
        reason: ``cwd_not_found``, ``command_not_found`` or ``never_fits``.
    """

    def __init__(self, message: str, *, reason: str, name: str = "") -> None:
        super().__init__(message, name=name)
        self.reason = reason


class AlreadyEndedError(RoomkeeperError):
    """The lease has already ended, so it cannot be granted again or extended (a conflict
    with its state, not a malformed request).

    Attributes:
        lease_id: the lease.
    """

    def __init__(self, message: str, *, lease_id: str) -> None:
        super().__init__(message)
        self.lease_id = lease_id


class WorktreeError(UnrunnableError):
    """A job's git worktree cannot be made; nothing was started.

    Attributes:
        reason: ``not_a_repository``, ``invalid_branch``, ``branch_checked_out``,
            ``dirty_base`` or ``worktree_failed``.
        repo: the repository path the job gave.
    """

    def __init__(self, message: str, *, reason: str, repo: str) -> None:
        super().__init__(message, reason=reason, name="worktree")
        self.repo = repo


_SAID: set[tuple[str, str, str]] = set()
_SAID_MOST = 256  # distinct failures remembered; past it, each is said again
_SAID_LOCK = threading.Lock()


def say_failure_once(what: str, err: BaseException) -> None:
    """Log a failure a loop goes on past, once per distinct cause, with that cause.

    A loop that must outlive a failure (the resume loop, a retry, an expiry timer)
    would otherwise either swallow it unseen or repeat it every turn; the first
    time a cause is seen it is logged at error, its repeats at debug.

    Args:
        what: what failed, in words (``"the resume loop"``).
        err: the failure.
    """
    key = (what, type(err).__name__, str(err)[:200])
    with _SAID_LOCK:
        first = key not in _SAID
        if first:
            if len(_SAID) >= _SAID_MOST:
                _SAID.clear()
            _SAID.add(key)
    level = logging.ERROR if first else logging.DEBUG
    _log.log(level, "%s failed (it goes on, and tries again): %s: %s", what, key[1], err)


# The client's errors are named for what a caller catches (``except NoRoom:``), as the
# client's documentation names them: the names are its interface.
class GatewayError(RoomkeeperError):
    """The gateway answered a client's request with an error (``roomkeeper.client``).

    Attributes:
        status: the HTTP status (0 when no answer came).
        reason: the answer's machine-readable ``reason``.
        detail: the answer's words for people.
    """

    def __init__(self, detail: str, *, status: int = 0, reason: str = "") -> None:
        super().__init__(detail)
        self.status = status
        self.reason = reason
        self.detail = detail


class NoRoom(GatewayError):  # noqa: N818
    """The guard refused the lease: no room for it now (waiting may bring some).

    Attributes:
        summary: every number that decided it, in words.
    """

    def __init__(self, detail: str, *, status: int = 409, reason: str = "", summary: str = ""):
        super().__init__(detail, status=status, reason=reason)
        self.summary = summary


class QueueFull(GatewayError):  # noqa: N818
    """A bound was reached (a queue, the granted leases, the followed streams): nothing was
    queued or granted, so asking again later is safe."""


class NotFound(GatewayError):  # noqa: N818
    """No job, lease or call has the id asked for."""


class Unauthorized(GatewayError):  # noqa: N818
    """The token is missing or wrong: set ROOMKEEPER_TOKEN, or ROOMKEEPER_HOME to the
    gateway's home (its ``token`` file)."""


class GatewayUnavailable(GatewayError):  # noqa: N818
    """No answer came (the gateway is down or unreachable), or it answered 503 (shutting
    down, a save that did not answer): ask again later."""
