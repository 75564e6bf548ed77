"""Settings read from ``ROOMKEEPER_*`` variables, afresh on every call.

There is no restart to reconfigure: every part asks
:func:`read_settings` when it needs a value.  A value that cannot be used is
replaced by its default and said so in the log once per distinct value, so a
typo is visible without flooding the log of a loop that reads it every round.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from roomkeeper.errors import UsageError
from roomkeeper.units import MIB

log = logging.getLogger("roomkeeper")

_T = TypeVar("_T")
_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()

_TRUE_WORDS = {"on", "1", "true", "yes"}
_FALSE_WORDS = {"off", "0", "false", "no"}


@dataclass(frozen=True, slots=True)
class Settings:
    """One consistent snapshot of every variable the guard uses.

    Sizes are bytes (the variables are MiB); durations are seconds.
    """

    guard_on: bool = True
    job_memory_bytes: int = 1024 * MIB
    memory_headroom_percent: float = 10.0
    job_warmup_seconds: float = 600.0
    job_disk_bytes: int = 2048 * MIB
    disk_headroom_percent: float = 10.0
    memory_limit_bytes: int | None = None
    workspace: str | None = None


def warn_once(name: str, value: str, message: str) -> None:
    """Log ``message`` once per (variable, value) for the life of the process."""
    key = (name, value)
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    log.warning(message)


def _variable(
    env: Mapping[str, str],
    name: str,
    default: _T,
    convert: Callable[[str], _T],
    rule: str,
) -> _T:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return convert(raw.strip())
    except (ValueError, OverflowError):
        warn_once(name, raw, f"{name}={raw!r} is not usable: {rule}; using the default {default}")
        return default


def max_running_given(env: Mapping[str, str] | None = None) -> bool:
    """Whether a person set ROOMKEEPER_MAX_RUNNING to a value the queue uses."""
    return _usable(os.environ if env is None else env, "ROOMKEEPER_MAX_RUNNING", _AT_LEAST_ONE)


def _usable(env: Mapping[str, str], name: str, convert: Callable[[str], object]) -> bool:
    """Whether a person set ``name`` to a value :func:`_variable` would use."""
    raw = env.get(name, "").strip()
    try:
        return bool(raw) and convert(raw) is not None
    except (ValueError, OverflowError):
        return False


def _number(low: float, high: float) -> Callable[[str], float]:
    def convert(text: str) -> float:
        value = float(text)
        if not (low <= value <= high):  # also rejects nan
            raise ValueError(text)
        return value

    return convert


def _integer(low: int, high: int) -> Callable[[str], int]:
    def convert(text: str) -> int:
        value = int(text)
        if not (low <= value <= high):
            raise ValueError(text)
        return value

    return convert


def _mib(low: float) -> Callable[[str], int]:
    to_number = _number(low, 2**43)  # 8 EiB in MiB: anything larger is a typo

    def convert(text: str) -> int:
        return int(to_number(text) * MIB)

    return convert


def _switch(text: str) -> bool:
    word = text.lower()
    if word in _TRUE_WORDS:
        return True
    if word in _FALSE_WORDS:
        return False
    raise ValueError(text)


_MIB_AT_LEAST_0 = _mib(0)
_MIB_AT_LEAST_1 = _mib(1)
_PERCENT = _number(0, 100)
_SECONDS = _number(0, 10**9)


_SETTINGS_VARIABLES = (
    "ROOMKEEPER_GUARD",
    "ROOMKEEPER_JOB_MEMORY_MB",
    "ROOMKEEPER_MEMORY_HEADROOM_PERCENT",
    "ROOMKEEPER_JOB_WARMUP_SECONDS",
    "ROOMKEEPER_JOB_DISK_MB",
    "ROOMKEEPER_DISK_HEADROOM_PERCENT",
    "ROOMKEEPER_MEMORY_LIMIT_MB",
    "ROOMKEEPER_WORKSPACE",
)


def read_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Read every ``ROOMKEEPER_*`` variable now.

    The variables are looked up on every call; only their conversion is kept, by their
    raw values, since the guard asks for settings on every decision.

    Args:
        env: the environment to read; ``os.environ`` when omitted.
    """
    env = os.environ if env is None else env
    return _converted(_raw_values(env))


_ENCODED_VARIABLES = tuple(os.fsencode(name) for name in _SETTINGS_VARIABLES)


def _raw_values(env: Mapping[str, str]) -> tuple[str | None, ...]:
    """The variables' raw values in ``env``.

    ``os.environ.get`` raises and catches a KeyError inside for every variable not set (most
    of them), which costs more than the rest of a guard's decision besides its reads; the
    dict of encoded names under ``os.environ`` (CPython's, where it keeps what ``os.environ``
    shows, encoded as :func:`os.fsencode` does) answers the same without one.
    """
    data = getattr(env, "_data", None) if env is os.environ and os.name == "posix" else None
    if isinstance(data, dict):
        return tuple(
            None if (raw := data.get(key)) is None else os.fsdecode(raw)
            for key in _ENCODED_VARIABLES
        )
    return tuple(map(env.get, _SETTINGS_VARIABLES))


@functools.lru_cache(maxsize=32)
def _converted(raw: tuple[str | None, ...]) -> Settings:
    """The settings these raw values of :data:`_SETTINGS_VARIABLES` say (a value that cannot
    be used is said once)."""
    env = {
        name: value
        for name, value in zip(_SETTINGS_VARIABLES, raw, strict=True)
        if value is not None
    }
    d = Settings()
    stated_limit = _variable(
        env, "ROOMKEEPER_MEMORY_LIMIT_MB", None, _MIB_AT_LEAST_1, "a number of MiB greater than 0"
    )
    return Settings(
        guard_on=_variable(env, "ROOMKEEPER_GUARD", d.guard_on, _switch, "on or off"),
        job_memory_bytes=_variable(
            env,
            "ROOMKEEPER_JOB_MEMORY_MB",
            d.job_memory_bytes,
            _MIB_AT_LEAST_0,
            "a number of MiB >= 0",
        ),
        memory_headroom_percent=_variable(
            env,
            "ROOMKEEPER_MEMORY_HEADROOM_PERCENT",
            d.memory_headroom_percent,
            _PERCENT,
            "a percentage from 0 to 100",
        ),
        job_warmup_seconds=_variable(
            env,
            "ROOMKEEPER_JOB_WARMUP_SECONDS",
            d.job_warmup_seconds,
            _SECONDS,
            "a number of seconds >= 0",
        ),
        job_disk_bytes=_variable(
            env, "ROOMKEEPER_JOB_DISK_MB", d.job_disk_bytes, _MIB_AT_LEAST_0, "a number of MiB >= 0"
        ),
        disk_headroom_percent=_variable(
            env,
            "ROOMKEEPER_DISK_HEADROOM_PERCENT",
            d.disk_headroom_percent,
            _PERCENT,
            "a percentage from 0 to 100",
        ),
        memory_limit_bytes=stated_limit,
        workspace=env.get("ROOMKEEPER_WORKSPACE") or None,
    )


REAP_AT_PERCENT = 80.0  # worktree creation prunes first above 80 % used


def read_reap_at_percent(env: Mapping[str, str] | None = None) -> float:
    """ROOMKEEPER_REAP_AT_PERCENT now: above this much of the workspace volume used,
    making a job's worktree prunes finished ones first (default 80)."""
    env = os.environ if env is None else env
    return _variable(
        env,
        "ROOMKEEPER_REAP_AT_PERCENT",
        REAP_AT_PERCENT,
        _number(1, 100),
        "a percentage from 1 to 100",
    )


@dataclass(frozen=True, slots=True)
class QueueSettings:
    """The scheduler's bounds and what its workers inherit."""

    max_waiting: int = 32
    max_waiting_per_owner: int = 8
    max_running: int = 4
    max_running_per_owner: int = 2
    cpu_pressure_percent: float = 80.0
    worker_nice: int = 10


_AT_LEAST_ONE = _integer(1, 10**4)
# Waiting bounds start at 1: every job waits before its first launch round, so 0
# would refuse every submission.
_WAITING_BOUND = _integer(1, 10**6)


def read_queue_settings(env: Mapping[str, str] | None = None) -> QueueSettings:
    """Read the scheduler's variables now (``ROOMKEEPER_MAX_*``, CPU pressure, nice).

    Args:
        env: the environment to read; ``os.environ`` when omitted.
    """
    env = os.environ if env is None else env
    d = QueueSettings()
    return QueueSettings(
        max_waiting=_variable(
            env,
            "ROOMKEEPER_MAX_WAITING",
            d.max_waiting,
            _WAITING_BOUND,
            "an integer from 1 to 1000000",
        ),
        max_waiting_per_owner=_variable(
            env,
            "ROOMKEEPER_MAX_WAITING_PER_OWNER",
            d.max_waiting_per_owner,
            _WAITING_BOUND,
            "an integer from 1 to 1000000",
        ),
        max_running=_variable(
            env,
            "ROOMKEEPER_MAX_RUNNING",
            d.max_running,
            _AT_LEAST_ONE,
            "an integer from 1 to 10000",
        ),
        max_running_per_owner=_variable(
            env,
            "ROOMKEEPER_MAX_RUNNING_PER_OWNER",
            d.max_running_per_owner,
            _AT_LEAST_ONE,
            "an integer from 1 to 10000",
        ),
        cpu_pressure_percent=_variable(
            env,
            "ROOMKEEPER_CPU_PRESSURE_PERCENT",
            d.cpu_pressure_percent,
            _PERCENT,
            "a percentage from 0 to 100",
        ),
        worker_nice=_variable(
            env, "ROOMKEEPER_WORKER_NICE", d.worker_nice, _integer(0, 19), "an integer 0 to 19"
        ),
    )


def read_batch_cpu_settings(env: Mapping[str, str] | None = None) -> tuple[int, float | None]:
    """A batch's worker nice and CPU-pressure gate: only what the environment sets.

    roomkeeper lowers workers' CPU priority and gates launches on CPU pressure to
    keep the gateway answering while its callers' work runs.  A batch has no
    gateway, and ``--max-running`` is the person's own CPU decision, as
    ``parallel -j`` is: so its jobs run at nice 0 with no CPU gate unless
    ROOMKEEPER_WORKER_NICE or ROOMKEEPER_CPU_PRESSURE_PERCENT is set.  With
    the gateway's defaults, real short work took 1.11x ``parallel -j4``
    (benchmarks/RESULTS.md).  A value that is not usable is warned of and the
    batch's own default (nice 0, no gate) is used, as for an unset one.

    Returns:
        (nice, CPU pressure percent or None for no gate).
    """
    env = os.environ if env is None else env
    nice = _variable(env, "ROOMKEEPER_WORKER_NICE", 0, _integer(0, 19), "an integer 0 to 19")
    name = "ROOMKEEPER_CPU_PRESSURE_PERCENT"
    raw = env.get(name, "").strip()
    if not raw:
        return nice, None
    try:
        return nice, _PERCENT(raw)
    except ValueError:
        warn_once(
            name,
            raw,
            f"{name}={raw!r} is not usable: a percentage from 0 to 100; "
            "this batch holds no launch for CPU pressure",
        )
        return nice, None


@dataclass(frozen=True, slots=True)
class PressureSettings:
    """The relief ladder's variables ("sustained critical memory pressure").

    Attributes:
        full_percent: PSI memory ``full`` avg10 above which pressure is critical.
        full_seconds: how long it must stay critical before a tree is stopped.
        cooldown_s: admission held after a supervisor's relief request, and the most it
            is held after a stop for pressure.
        cooldown_fixed: a person set ROOMKEEPER_PRESSURE_COOLDOWN: a stop holds admission
            that long.  Otherwise a stop holds it only until the stopped tree's memory is
            back and the running jobs' forecast fits under the line (at most ``cooldown_s``).
        retries: how many times restartable work stopped for pressure runs again.
    """

    full_percent: float = 20.0
    full_seconds: float = 5.0
    cooldown_s: float = 60.0
    cooldown_fixed: bool = False
    retries: int = 3


def read_pressure_settings(env: Mapping[str, str] | None = None) -> PressureSettings:
    """Read ROOMKEEPER_PRESSURE_FULL_PERCENT, _SECONDS, _COOLDOWN and _RETRIES now.

    Args:
        env: the environment to read; ``os.environ`` when omitted.
    """
    env = os.environ if env is None else env
    d = PressureSettings()
    return PressureSettings(
        full_percent=_variable(
            env,
            "ROOMKEEPER_PRESSURE_FULL_PERCENT",
            d.full_percent,
            _PERCENT,
            "a percentage from 0 to 100",
        ),
        full_seconds=_variable(
            env,
            "ROOMKEEPER_PRESSURE_SECONDS",
            d.full_seconds,
            _SECONDS,
            "a number of seconds >= 0",
        ),
        cooldown_s=_variable(
            env,
            "ROOMKEEPER_PRESSURE_COOLDOWN",
            d.cooldown_s,
            _SECONDS,
            "a number of seconds >= 0",
        ),
        cooldown_fixed=_usable(env, "ROOMKEEPER_PRESSURE_COOLDOWN", _SECONDS),
        retries=_variable(
            env, "ROOMKEEPER_PRESSURE_RETRIES", d.retries, _integer(0, 100), "an integer 0 to 100"
        ),
    )


@dataclass(frozen=True, slots=True)
class BaselineSettings:
    """When memory that no live work explains counts as not given back.

    Attributes:
        growth_percent: how far the baseline must rise, in percent of the memory line.
        endings: across how many job or lease endings at least.
    """

    growth_percent: float = 10.0
    endings: int = 10


def read_baseline_settings(env: Mapping[str, str] | None = None) -> BaselineSettings:
    """Read ROOMKEEPER_BASELINE_GROWTH_PERCENT and ROOMKEEPER_BASELINE_ENDINGS now.

    Args:
        env: the environment to read; ``os.environ`` when omitted.
    """
    env = os.environ if env is None else env
    d = BaselineSettings()
    return BaselineSettings(
        growth_percent=_variable(
            env,
            "ROOMKEEPER_BASELINE_GROWTH_PERCENT",
            d.growth_percent,
            _number(0.1, 100),
            "a percentage from 0.1 to 100",
        ),
        endings=_variable(
            env,
            "ROOMKEEPER_BASELINE_ENDINGS",
            d.endings,
            _integer(1, 10000),
            "an integer 1 to 10000",
        ),
    )


@dataclass(frozen=True, slots=True)
class GatewaySettings:
    """The gateway's own variables."""

    port: int = 8765
    gateway_reserve_bytes: int = 256 * MIB
    shutdown_s: float = 10.0
    history_max_events: int = 500


GATEWAY_RESERVE_SHARE = 8  # unstated, the gateway's reserve is at most an eighth of the limit


def gateway_reserve_bytes(limit_bytes: int, env: Mapping[str, str] | None = None) -> int:
    """What the gateway keeps free for its own growth in a container of ``limit_bytes``.

    ROOMKEEPER_GATEWAY_RESERVE_MB when a person set it; else its default (256 MiB), but
    at most an eighth of the limit, so that a 256 or 512 MiB container still runs work.
    """
    env = os.environ if env is None else env
    reserve = read_gateway_settings(env).gateway_reserve_bytes
    if env.get("ROOMKEEPER_GATEWAY_RESERVE_MB", "").strip():
        return reserve
    return min(reserve, max(0, limit_bytes) // GATEWAY_RESERVE_SHARE)


def read_gateway_settings(env: Mapping[str, str] | None = None) -> GatewaySettings:
    """Read ROOMKEEPER_PORT, _GATEWAY_RESERVE_MB, _SHUTDOWN_S and _HISTORY_MAX_EVENTS now."""
    env = os.environ if env is None else env
    d = GatewaySettings()
    return GatewaySettings(
        port=_variable(env, "ROOMKEEPER_PORT", d.port, _integer(1, 65535), "a port 1 to 65535"),
        gateway_reserve_bytes=_variable(
            env,
            "ROOMKEEPER_GATEWAY_RESERVE_MB",
            d.gateway_reserve_bytes,
            _MIB_AT_LEAST_0,
            "a number of MiB >= 0",
        ),
        shutdown_s=_variable(
            env, "ROOMKEEPER_SHUTDOWN_S", d.shutdown_s, _number(1, 3600), "seconds, 1 to 3600"
        ),
        history_max_events=_variable(
            env,
            "ROOMKEEPER_HISTORY_MAX_EVENTS",
            d.history_max_events,
            _integer(1, 100_000),
            "an integer 1 to 100000",
        ),
    )


def read_journal_synchronous(env: Mapping[str, str]) -> str:
    """ROOMKEEPER_JOURNAL_SYNCHRONOUS: FULL (default) or, to measure what it costs, NORMAL/OFF."""
    value = env.get("ROOMKEEPER_JOURNAL_SYNCHRONOUS", "FULL").upper()
    if value not in ("FULL", "NORMAL", "OFF"):
        warn_once(
            "ROOMKEEPER_JOURNAL_SYNCHRONOUS",
            value,
            f"ROOMKEEPER_JOURNAL_SYNCHRONOUS={value!r} is not usable: FULL, NORMAL or OFF; "
            "using the default FULL",
        )
        return "FULL"
    return value


RESTART_BACKOFF_S = 1.0
"""The wait before the first restart after a failure, doubling from there."""
RESTART_BACKOFF_MAX_S = 60.0
"""The longest wait between failure restarts."""


@dataclass(frozen=True, slots=True)
class WatchdogSettings:
    """The supervisor's stages and restart pacing, in seconds.

    The stages and the cooldown are variables; the backoff (``backoff_s``,
    ``backoff_max_s``: 1 s doubling to 60 s) is not: only the supervisor's
    constructor changes it (a test that needs short waits passes its own).
    """

    start_s: float = 120.0
    heartbeat_s: float = 30.0
    relief_s: float = 20.0
    shutdown_s: float = 15.0
    cooldown_s: float = 900.0
    backoff_s: float = RESTART_BACKOFF_S
    backoff_max_s: float = RESTART_BACKOFF_MAX_S


def read_watchdog_settings(env: Mapping[str, str] | None = None) -> WatchdogSettings:
    """Read ROOMKEEPER_WATCHDOG_START/_HEARTBEAT/_RELIEF/_SHUTDOWN and the cooldown now.

    The cooldown is ROOMKEEPER_RESTART_COOLDOWN; the backoff keeps its defaults.

    Args:
        env: the environment to read; ``os.environ`` when omitted.
    """
    env = os.environ if env is None else env
    d = WatchdogSettings()
    stage = _number(0.1, 86_400)
    rule = "seconds, 0.1 to 86400"
    return WatchdogSettings(
        start_s=_variable(env, "ROOMKEEPER_WATCHDOG_START", d.start_s, stage, rule),
        heartbeat_s=_variable(env, "ROOMKEEPER_WATCHDOG_HEARTBEAT", d.heartbeat_s, stage, rule),
        relief_s=_variable(env, "ROOMKEEPER_WATCHDOG_RELIEF", d.relief_s, stage, rule),
        shutdown_s=_variable(env, "ROOMKEEPER_WATCHDOG_SHUTDOWN", d.shutdown_s, stage, rule),
        cooldown_s=_variable(
            env, "ROOMKEEPER_RESTART_COOLDOWN", d.cooldown_s, _SECONDS, "a number of seconds >= 0"
        ),
    )


BACKENDS = ("local", "ray")
"""Where admitted jobs run: ``local`` managed trees, or tasks on a Ray cluster."""


@dataclass(frozen=True, slots=True)
class BackendSettings:
    """ROOMKEEPER_BACKEND and, for ``ray``, the head's address and each job's CPU need.

    Attributes:
        backend: ``local`` or ``ray``.
        ray_address: ROOMKEEPER_RAY_ADDRESS, the head's ``HOST:PORT`` (GCS port).
        ray_job_cpus: ROOMKEEPER_RAY_JOB_CPUS, the ``num_cpus`` each job asks of Ray (1).
        ray_node_monitors: ROOMKEEPER_RAY_NODE_MONITORS, whether every node runs the
            pressure monitor and its ladder for the jobs it runs (on).
    """

    backend: str = "local"
    ray_address: str | None = None
    ray_job_cpus: float = 1.0
    ray_node_monitors: bool = True


def _ray_address(text: str) -> str:
    """``HOST:PORT``; anything else raises ValueError."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(text)
    return text


def read_backend_settings(env: Mapping[str, str] | None = None) -> BackendSettings:
    """Read ROOMKEEPER_BACKEND and ROOMKEEPER_RAY_ADDRESS, strictly.

    Unlike the guard's variables these do not fall back to a default: a
    typo would run every job on the wrong machines, so the gateway refuses
    to start and says what to write instead.

    Raises:
        UsageError: the backend is neither ``local`` nor ``ray``, or ``ray``
            is chosen without a usable ROOMKEEPER_RAY_ADDRESS.
    """
    env = os.environ if env is None else env
    backend = (env.get("ROOMKEEPER_BACKEND") or "local").strip().lower()
    if backend not in BACKENDS:
        raise UsageError(
            f"ROOMKEEPER_BACKEND={backend!r} is not a backend: write local (the default) or ray",
            name="ROOMKEEPER_BACKEND",
            value=backend,
        )
    raw = (env.get("ROOMKEEPER_RAY_ADDRESS") or "").strip()
    if backend == "local":
        return BackendSettings()
    try:
        address = _ray_address(raw)
    except ValueError:
        shown = repr(raw) if raw else "unset"
        raise UsageError(
            f"ROOMKEEPER_BACKEND=ray needs ROOMKEEPER_RAY_ADDRESS=HOST:PORT, the Ray head's "
            f"address (ray start --head --port PORT); it is {shown}",
            name="ROOMKEEPER_RAY_ADDRESS",
            value=raw,
        ) from None
    cpus = _variable(
        env, "ROOMKEEPER_RAY_JOB_CPUS", 1.0, _number(0, 1024), "a number of CPUs from 0 to 1024"
    )
    monitors = _variable(env, "ROOMKEEPER_RAY_NODE_MONITORS", True, _switch, "on or off")
    return BackendSettings(
        backend="ray", ray_address=address, ray_job_cpus=cpus, ray_node_monitors=monitors
    )
