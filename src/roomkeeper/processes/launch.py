"""Launching a job: what to run (:class:`LaunchSpec`) and starting it as a managed tree.

A job runs from argv (a shell only when asked), in its own session and
process group, at the CPU priority it is given (never above ours), which its
descendants inherit, with stdin from ``/dev/null`` and stdout and stderr in
a log file that outlives it.  Where the kernel allows, it gets its own memory cgroup under
roomkeeper's own group (so the container is still charged for it), which
measures its footprint and finds every member, however it tried to leave.

Where the job has no v2 group but a v1 freezer hierarchy is mounted, it
also gets a freezer group of its own, so that it can be suspended whole
(:meth:`~roomkeeper.processes.process.ManagedProcess.suspend`).

The job must join its cgroups *before* the real command runs, or a fork could
escape them.  ``preexec_fn`` is unsafe in a multithreaded scheduler, so the
job's own first process joins them: shell text is run as
``/bin/sh -c 'echo $$ > <cgroup.procs> || exit $?; TEXT'`` (the join on the
text's first line, so the shell's line numbers stay the text's own), and an
argv goes through a trampoline::

    /bin/sh -c 'echo $$ > "$0" && exec "$@"' <cgroup.procs> argv...

``$$`` is the pid the job keeps through the exec; with a freezer group too,
it writes both files first, and a join that fails runs nothing.  A job that
runs at a lower priority than ours is started as ``nice -n N`` followed by
all of that (``nice`` forks nothing, so the join still comes before any
fork).  A shell (bash as ``/bin/sh``) that quotes the line of a syntax error
shows the join beside an error on the text's first line.

The priority is not lowered from a thread of ours at the job's nice value
instead of by ``nice``: under a CPU-bound load, such a thread is the last to
run, and it holds the interpreter lock in the fork, so every other thread
(the pressure monitor's) waits, and the job runs before the lifeline knows it.

Because ``nice`` reports a missing command only as exit status 127, the
executable of an argv is looked up first, on the PATH the job will use: a
missing one is a :class:`LaunchError`, not a job that ran and failed (one
removed between the look-up and the exec still exits 127).

:func:`launch` hands back a :class:`~roomkeeper.processes.process.ManagedProcess`,
which owns the running tree from then on.
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from roomkeeper.errors import LaunchError, RoomkeeperError, UsageError
from roomkeeper.kernel.freezer import FreezerGroup
from roomkeeper.kernel.job_cgroups import JobCgroup, create_job_cgroup, create_job_freezer
from roomkeeper.processes.job_user import JobUser
from roomkeeper.processes.lifeline import Lifeline
from roomkeeper.processes.process import ManagedProcess

__all__ = ["LaunchSpec", "launch"]


def _trampoline(procs_files: Sequence[str]) -> list[str]:
    """``sh -c`` that writes its pid into each ``cgroup.procs`` file, then execs the rest."""
    joins = " && ".join(f'echo $$ > "${i}"' for i in range(len(procs_files)))
    shift = f" && shift {len(procs_files) - 1}" if len(procs_files) > 1 else ""
    return ["/bin/sh", "-c", f'{joins}{shift} && exec "$@"', *procs_files]


def _joined_shell(procs_files: Sequence[str], text: str) -> list[str]:
    """``sh -c`` that writes its pid into each ``cgroup.procs`` file, then runs ``text`` itself.

    The join shares the text's first line, so an error in the text names the text's own line.
    """
    joins = " && ".join(f"echo $$ > {shlex.quote(path)}" for path in procs_files)
    return ["/bin/sh", "-c", f"{joins} || exit $?; {text}"]


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """What to run and how.

    Attributes:
        argv: the program and its arguments, never run through a shell unless ``shell``.
        log_path: the file that receives stdout and stderr (appended to, kept afterwards).
        cwd: the working directory; None for the scheduler's.
        env: the whole environment; None to inherit the scheduler's.
        nice: the niceness the job and every descendant run at; a job is never raised above us.
        shell: run ``argv``, one string, with ``/bin/sh -c``.
        use_cgroup: try a memory cgroup of the job's own; without one, psutil measures.
        use_freezer: where the job has no v2 group, try a v1 freezer group of
            its own; without either, suspending it signals every process.
        user: the user the job runs as (:mod:`roomkeeper.processes.job_user`); None: ours.
        memory_bytes: the job's memory estimate, for a launcher that places it
            elsewhere (the Ray backend's ``memory`` resource); unused here.
        disk_bytes: the job's own disk estimate (None: the default); unused here.
        deadline_s: seconds the job has left when launched (None: no deadline),
            for a launcher whose nodes enforce it too; unused here.
        restartable: it may be stopped for memory pressure and run again, for a launcher
            whose nodes run the relief ladder themselves; unused here.
        last_run: its last allowed run (the ladder there stops it last); unused here.
        rerun_peak: a re-run's peak in the run stopped for pressure (None: a first run), for
            a launcher whose nodes judge it; unused here.
        runs_again: a stop for pressure queues it again (restartable, with re-runs left),
            for a launcher whose nodes may stop a frozen tree to let an older one go on;
            unused here.
        pass_fds: descriptors the job inherits beside stdin, stdout and stderr (its
            jobserver's, :mod:`roomkeeper.jobserver`).
    """

    argv: Sequence[str]
    log_path: str
    cwd: str | None = None
    env: Mapping[str, str] | None = None
    nice: int = 10
    shell: bool = False
    use_cgroup: bool = True
    use_freezer: bool = True
    user: JobUser | None = None
    memory_bytes: int = 0
    disk_bytes: int | None = None
    deadline_s: float | None = None
    restartable: bool = False
    last_run: bool = False
    rerun_peak: int | None = None
    runs_again: bool = False
    pass_fds: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not -20 <= self.nice <= 19:
            raise UsageError(f"nice must be in -20..19 (got {self.nice})", name="nice")
        text = isinstance(self.argv, str)
        if (self.shell and not (text or len(self.argv) == 1)) or (
            not self.shell and (text or not self.argv)
        ):
            want = "one string" if self.shell else "a non-empty list (shell=True runs shell text)"
            raise UsageError(f"argv must be {want} (got {self.argv!r})", name="argv")

    def command(self) -> list[str]:
        """The argv that runs, before nice and the joining of the job's groups."""
        if self.shell:
            return ["/bin/sh", "-c", self.argv if isinstance(self.argv, str) else self.argv[0]]
        return list(self.argv)


@functools.cache
def _nice_path() -> str:
    return shutil.which("nice") or "/usr/bin/nice"


def _check_launchable(job_id: str, spec: LaunchSpec) -> None:
    if spec.cwd is not None and not os.path.isdir(spec.cwd):
        what = "is not a directory" if os.path.exists(spec.cwd) else "does not exist"
        raise LaunchError(job_id, f"working directory {spec.cwd!r} {what}; create it first")
    if spec.shell:
        return  # the shell reports a missing command itself (status 127)
    program = spec.argv[0]
    env_path = (spec.env if spec.env is not None else os.environ).get("PATH", os.defpath)
    if "/" in program:  # execvp looks it up from the job's cwd, not along PATH
        full = os.path.join(spec.cwd or ".", program)
        if not (os.path.isfile(full) and os.access(full, os.X_OK)):
            raise LaunchError(job_id, f"executable {program!r} does not exist or cannot be run")
    elif shutil.which(program, path=env_path) is None:
        raise LaunchError(
            job_id, f"executable {program!r} not found on PATH {env_path!r}; give its full path"
        )


def launch(job_id: str, spec: LaunchSpec, *, lifeline: Lifeline | None = None) -> ManagedProcess:
    """Start a job as a managed process tree, watched by ``lifeline`` when given.

    Raises:
        LaunchError: it could not start (missing executable, bad cwd, log not writable,
            no lifeline); nothing of it is left running, and no cgroup is left behind.
    """
    _check_launchable(job_id, spec)
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
    try:
        log_fd = os.open(spec.log_path, flags, 0o600)  # a job's output is its owner's
    except OSError as err:
        raise LaunchError(job_id, f"cannot open log {spec.log_path!r}: {err.strerror}") from err
    cgroup: JobCgroup | str = "not asked for"
    freezer_group: FreezerGroup | None = None
    try:
        if lifeline is not None:
            lifeline.start()  # before the spawn: nothing may run unwatched
        cgroup, freezer_group = _make_groups(job_id, spec)
        popen = subprocess.Popen(
            _argv(spec, cgroup, freezer_group),
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=subprocess.STDOUT,
            cwd=spec.cwd,
            env=None if spec.env is None else dict(spec.env),
            start_new_session=True,
            pass_fds=spec.pass_fds,
        )
    except (OSError, RoomkeeperError) as err:
        if isinstance(cgroup, JobCgroup):
            cgroup.remove()
        if freezer_group is not None:
            freezer_group.remove()
        reason = f"cannot start {spec.argv[0]!r}: {err}" if isinstance(err, OSError) else str(err)
        raise LaunchError(job_id, reason) from err
    finally:
        os.close(log_fd)
    process = ManagedProcess(
        job_id,
        popen,
        log_path=spec.log_path,
        cgroup=cgroup,
        lifeline=lifeline,
        freezer_group=freezer_group,
    )
    if lifeline is not None:
        try:
            lifeline.register(popen.pid, popen.pid, process.cgroup_dir, process.freezer_dir)
        except (OSError, RoomkeeperError) as err:
            process.close()
            raise LaunchError(job_id, f"the lifeline could not take the job: {err}") from err
    return process


def _make_groups(job_id: str, spec: LaunchSpec) -> tuple[JobCgroup | str, FreezerGroup | None]:
    """The job's memory group (or why none) and, where it has no v2 group, its freezer group."""
    cgroup: JobCgroup | str = create_job_cgroup(job_id) if spec.use_cgroup else "not asked for"
    freezer_group = None
    if spec.use_freezer and not (isinstance(cgroup, JobCgroup) and cgroup.version == 2):
        made = create_job_freezer(job_id)
        freezer_group = made if isinstance(made, FreezerGroup) else None
    return cgroup, freezer_group


def _argv(
    spec: LaunchSpec, cgroup: JobCgroup | str, freezer_group: FreezerGroup | None
) -> list[str]:
    """What to exec: nice, then the command, its first shell joining the job's groups."""
    # Niceness is per thread, inherited from the forking one; we lower it, never raise it.
    increment = max(0, spec.nice - os.getpriority(os.PRIO_PROCESS, 0))
    nice = [_nice_path(), "-n", str(increment)] if increment else []
    procs = [f"{cgroup.directory}/cgroup.procs"] if isinstance(cgroup, JobCgroup) else []
    if freezer_group is not None:
        procs.append(f"{freezer_group.directory}/cgroup.procs")
    if spec.user is None and spec.shell and procs:
        return [*nice, *_joined_shell(procs, spec.command()[2])]
    argv = spec.command() if spec.user is None else spec.user.command(spec.command())
    return [*nice, *_trampoline(procs), *argv] if procs else [*nice, *argv]
