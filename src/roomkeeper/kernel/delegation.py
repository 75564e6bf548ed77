"""Where job cgroups are made, and making room for them under cgroup v2's rules.

cgroup v2 hands a controller to a group's children only while the group
holds no processes itself ("no internal processes",
Documentation/admin-guide/cgroup-v2.rst); the root group is exempt.  So
before roomkeeper makes job groups on v2 it moves its own processes into a
leaf, ``<own>/roomkeeper``, enables the memory controller for ``<own>``'s
children, and makes each job's group in ``<own>/roomkeeper-jobs/``: what
systemd does inside a delegated unit (``Delegate=yes``) and what container
runtimes do with their init.  It does so only when every process in its
group is on its own line (itself, what started it, what it started) and
the group is writable.  A group that holds someone else's processes, or a
read-only ``/sys/fs/cgroup`` (common in containers), gets no job groups and
nothing is moved; :func:`prepare_job_groups` says why, and the guard says
so once in its "guard is on" line.  cgroup v1 has no such rule: job groups
are made directly under our own memory group.

:func:`job_group_place` only reads: it finds where job groups already are
(a later gateway finds its predecessor's there).  :func:`prepare_job_groups`
acts, once per process while it succeeds.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from dataclasses import dataclass

from roomkeeper.errors import KernelFileError
from roomkeeper.kernel import parsers
from roomkeeper.kernel.cgroup_hierarchy import (
    Hierarchy,
    controllers,
    locate_v2,
    read_file,
    v1_memory_group,
)
from roomkeeper.kernel.host import CGROUP_ROOT, PROC_ROOT

LEAF = "roomkeeper"  # where roomkeeper's own processes go: <own>/roomkeeper
JOBS_FOLDER = "roomkeeper-jobs"  # where job groups go: <own>/roomkeeper-jobs/<job>
_MOVE_ROUNDS = 20  # a process may fork while we move its family: list again until empty


@dataclass(frozen=True, slots=True)
class JobGroupPlace:
    """Where job groups are made, or why none are.

    Attributes:
        version: the cgroup version of the groups (1 or 2); None when none are made.
        directory: the folder job groups are made in; None when none are made.
        path: that folder as a cgroup path, as a person would look it up.
        leaf: the cgroup path of the leaf roomkeeper's own processes are in
            (v2, once moved); None where nothing was moved.
        reason: why no job groups are made, else None.
    """

    version: int | None
    directory: str | None
    path: str | None = None
    leaf: str | None = None
    reason: str | None = None

    def describe(self) -> str:
        """The place in words, for the guard's "guard is on" line."""
        if self.directory is None:
            return f"none: {self.reason}; jobs are measured by sampling their process trees"
        where = f"cgroup v{self.version} under {self.path}"
        return where if self.leaf is None else f"{where}, roomkeeper itself in {self.leaf}"


def _none(reason: str) -> JobGroupPlace:
    return JobGroupPlace(None, None, reason=reason)


def _parent_path(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[0] or "/"


def _child_path(path: str, name: str) -> str:
    return f"{path.rstrip('/')}/{name}"


def _is_our_leaf(group: Hierarchy) -> bool:
    """Whether the group is a leaf we (or an earlier roomkeeper on our line) moved into."""
    parent = os.path.dirname(group.own_dir)
    return (
        os.path.basename(group.own_dir) == LEAF
        and group.own_dir != group.mount_dir
        and os.path.isdir(f"{parent}/{JOBS_FOLDER}")
    )


def _is_true_root(group: Hierarchy) -> bool:
    """The hierarchy's real root, exempt from "no internal processes".

    A container's private cgroup namespace also shows its group as ``/``,
    but that group is not the root and has ``cgroup.type``; the root has none.
    """
    return group.own_path in ("", "/") and not os.path.exists(f"{group.own_dir}/cgroup.type")


def _v2_memory_group(proc_root: str, cgroup_root: str) -> Hierarchy | None:
    """Our v2 group, where its children can have the memory controller; else None."""
    group = locate_v2(proc_root, cgroup_root)
    if group is None or "memory" not in controllers(group.own_dir):
        return None
    return group


def job_group_place(proc_root: str = PROC_ROOT, cgroup_root: str = CGROUP_ROOT) -> JobGroupPlace:
    """Where job groups are made now, changing nothing; ``directory`` None where there are none.

    On v2 that is the folder beside our leaf (made by :func:`prepare_job_groups`
    in this process or an earlier one on our line) or under the root group;
    on v1, our own memory group.

    Raises:
        OSError, KernelFileError: the membership files could not be read.
    """
    group = _v2_memory_group(proc_root, cgroup_root)
    if group is not None:
        if _is_our_leaf(group):
            parent = _parent_path(group.own_path)
            directory = f"{os.path.dirname(group.own_dir)}/{JOBS_FOLDER}"
            return JobGroupPlace(2, directory, _child_path(parent, JOBS_FOLDER), group.own_path)
        directory = f"{group.own_dir}/{JOBS_FOLDER}"
        if _is_true_root(group) and os.path.isdir(directory):
            return JobGroupPlace(2, directory, _child_path(group.own_path, JOBS_FOLDER))
        return _none(f"no job groups made under {group.own_path} yet")
    v1 = v1_memory_group(proc_root, cgroup_root)
    if v1 is not None:
        return JobGroupPlace(1, v1.own_dir, v1.own_path or "/")
    return _none(_where_looked(proc_root, cgroup_root))


def _where_looked(proc_root: str, cgroup_root: str) -> str:
    """Why no memory controller was found, naming the files that were read."""
    group = locate_v2(proc_root, cgroup_root)
    v2 = (
        "no cgroup2 mount shows this process's group"
        if group is None
        else f"{group.own_dir}/cgroup.controllers does not offer memory"
    )
    return (
        f"no cgroup memory controller ({v2}; {proc_root}/self/cgroup names no v1 memory "
        "hierarchy that is mounted)"
    )


class _Prepared:
    """What :func:`prepare_job_groups` found last in this process, for the real roots."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pid = -1
        self.place: JobGroupPlace | None = None


_prepared = _Prepared()


def prepared_place() -> JobGroupPlace | None:
    """The last answer of :func:`prepare_job_groups` in this process (real roots), None before."""
    with _prepared.lock:
        return _prepared.place if _prepared.pid == os.getpid() else None


def prepare_job_groups(proc_root: str = PROC_ROOT, cgroup_root: str = CGROUP_ROOT) -> JobGroupPlace:
    """Make room for job groups where the rules allow; where they go, or why none are made.

    Idempotent.  A success is kept for the process (and checked to still
    exist); a refusal is judged again on the next call, since the processes
    in our group, or its mount, can change.  Never raises: a file that
    cannot be read or written is a refusal with the reason.
    """
    real = proc_root == PROC_ROOT and cgroup_root == CGROUP_ROOT
    with _prepared.lock:
        done = _prepared.place if real and _prepared.pid == os.getpid() else None
        if done is not None and done.directory is not None and os.path.isdir(done.directory):
            return done
        try:
            place = _prepare(proc_root, cgroup_root)
        except (OSError, KernelFileError) as err:
            place = _none(f"cannot read this process's cgroup: {err}")
        if real:
            _prepared.pid, _prepared.place = os.getpid(), place
        return place


def _prepare(proc_root: str, cgroup_root: str) -> JobGroupPlace:
    """One attempt of :func:`prepare_job_groups`."""
    group = _v2_memory_group(proc_root, cgroup_root)
    if group is None or _is_our_leaf(group):  # v1, none, or moved already: nothing to move
        place = job_group_place(proc_root, cgroup_root)
        if place.directory is not None and (unwritable := _unwritable(place.directory)):
            return _none(f"{place.path} is {unwritable}")
        return place
    if unwritable := _unwritable(group.own_dir):
        return _none(f"{group.own_path} is {unwritable}")
    jobs_dir = f"{group.own_dir}/{JOBS_FOLDER}"
    jobs_path = _child_path(group.own_path, JOBS_FOLDER)
    try:
        if _is_true_root(group):
            _enable_memory(group.own_dir)  # the root may hold processes and still delegate
            _make_jobs_folder(jobs_dir)
            return JobGroupPlace(2, jobs_dir, jobs_path)
        foreign = _foreign_processes(group.own_dir, proc_root)
        if foreign:
            return _none(_refusal(group.own_path, foreign))
        refused = _move_into_leaf(group, proc_root)
        if refused is not None:
            return _none(refused)
    except OSError as err:
        return _none(f"cannot make job groups under {group.own_path}: {_words(err)}")
    return JobGroupPlace(2, jobs_dir, jobs_path, _child_path(group.own_path, LEAF))


def _words(err: OSError) -> str:
    """The error and the file it was about, by its kernel name."""
    name = os.path.basename(str(err.filename)) if err.filename else ""
    return f"{err.strerror or err} ({name})" if name else str(err.strerror or err)


def _unwritable(directory: str) -> str | None:
    """ "read-only" or "not writable" where a group cannot be changed by us; None where it can."""
    try:
        if os.statvfs(directory).f_flag & os.ST_RDONLY:
            return "read-only (the cgroup file system is mounted read-only)"
    except OSError as err:
        return f"unreadable ({err.strerror})"
    if not os.access(directory, os.W_OK):
        return f"not writable by uid {os.geteuid()}"
    return None


def _refusal(path: str, foreign: list[tuple[int, str]]) -> str:
    pid, name = foreign[0]
    more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
    return (
        f"{path} holds processes roomkeeper did not start (pid {pid} {name}{more}), and "
        "cgroup v2 lets a group that holds processes give no controller to its children"
    )


def _stat(pid: int, proc_root: str) -> parsers.ProcessStat | None:
    try:
        return parsers.parse_pid_stat(read_file(f"{proc_root}/{pid}/stat"))
    except (OSError, KernelFileError):
        return None  # gone


def _ancestors(pid: int, proc_root: str) -> set[int]:
    """The pids above ``pid`` up to init, ``pid`` itself included."""
    line = {pid}
    while pid > 1 and (stat := _stat(pid, proc_root)) is not None and stat.ppid not in line:
        pid = stat.ppid
        if pid > 0:
            line.add(pid)
    return line


def _foreign_processes(own_dir: str, proc_root: str) -> list[tuple[int, str]]:
    """The processes in our group that are not on our line: (pid, name) each.

    Ours are this process, what started it (a shell, an init such as tini,
    the supervisor: moving them keeps them charged to the same group) and
    what it started.  Anything else belongs to someone else.
    """
    me = os.getpid()
    mine = _ancestors(me, proc_root)
    foreign = []
    for pid in _procs(own_dir):
        if pid in mine or me in _ancestors(pid, proc_root):
            continue
        stat = _stat(pid, proc_root)
        if stat is not None:  # one that exited meanwhile is nobody's
            foreign.append((pid, stat.comm))
    return foreign


def _procs(directory: str) -> list[int]:
    return [int(token) for token in read_file(f"{directory}/cgroup.procs").split()]


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _enable_memory(directory: str) -> None:
    if "memory" not in read_file(f"{directory}/cgroup.subtree_control").decode().split():
        _write(f"{directory}/cgroup.subtree_control", "+memory")


def _make_jobs_folder(directory: str) -> None:
    with contextlib.suppress(FileExistsError):
        os.mkdir(directory)
    _enable_memory(directory)


def _move_all(source: str, target: str, proc_root: str, *, refuse_foreign: bool) -> str | None:
    """Move every process of ``source`` into ``target``; a sentence where a stranger shows up."""
    for _ in range(_MOVE_ROUNDS):
        pids = _procs(source)
        if not pids:
            return None
        if refuse_foreign and (foreign := _foreign_processes(source, proc_root)):
            return _refusal(source, foreign)
        for pid in pids:
            try:
                _write(f"{target}/cgroup.procs", str(pid))
            except ProcessLookupError:
                continue  # it exited
            except OSError as err:
                if err.errno != errno.ESRCH:
                    raise
    return f"processes kept appearing in {source} while roomkeeper moved out of it"


def _move_into_leaf(group: Hierarchy, proc_root: str) -> str | None:
    """Move our line into ``<own>/roomkeeper`` and delegate memory; a sentence where it cannot.

    Undone on failure: the controller is taken back, the processes go back
    and the leaf is removed, so a refusal leaves the group as it was.
    """
    own, leaf = group.own_dir, f"{group.own_dir}/{LEAF}"
    made = not os.path.isdir(leaf)
    if made:
        os.mkdir(leaf)
    enabled = False
    try:
        refused = _move_all(own, leaf, proc_root, refuse_foreign=True)
        if refused is None:
            enabled = "memory" not in read_file(f"{own}/cgroup.subtree_control").decode().split()
            _enable_memory(own)
            _make_jobs_folder(f"{own}/{JOBS_FOLDER}")
            return None
    except OSError as err:
        refused = f"cannot make job groups under {group.own_path}: {_words(err)}"
    with contextlib.suppress(OSError):  # put everything back as it was
        if enabled:
            _write(f"{own}/cgroup.subtree_control", "-memory")
        _move_all(leaf, own, proc_root, refuse_foreign=False)
        if made:
            os.rmdir(leaf)
    return refused
