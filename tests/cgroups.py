"""Real cgroups and file systems for kernel tests: made where job groups go, always removed.

Each helper that cannot do its work skips the test and says where it looked;
none skips for a reason the cgroup v2 VM that CI runs them in has.  In the
read-only layout (a container's), :func:`memory_box` gives the fallback
roomkeeper takes there instead of a child group.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from roomkeeper.kernel.cgroup_hierarchy import controllers, locate_v2, v1_memory_group
from roomkeeper.kernel.delegation import prepare_job_groups
from roomkeeper.kernel.host import CGROUP_ROOT, PROC_ROOT
from roomkeeper.kernel.oom_kills import group_oom_kills, machine_oom_kills
from roomkeeper.kernel.resources import read_pressure_inputs


def own_memory_group() -> tuple[int, Path]:
    """(cgroup version, this process's own group in the memory hierarchy), or skip saying why.

    A process in the v2 root group has no ``memory.current`` (the kernel
    does not account the root), yet the memory controller is there: the root
    offers it in ``cgroup.controllers``.
    """
    v2 = locate_v2(PROC_ROOT, CGROUP_ROOT)
    if v2 is not None and "memory" in controllers(v2.own_dir):
        return 2, Path(v2.own_dir)
    v1 = v1_memory_group(PROC_ROOT, CGROUP_ROOT)
    if v1 is not None:
        return 1, Path(v1.own_dir)
    membership = Path("/proc/self/cgroup").read_text().strip().replace("\n", "; ")
    looked = (
        f"{v2.own_dir}/cgroup.controllers offers no memory"
        if v2 is not None
        else "no cgroup2 mount shows our group"
    )
    pytest.skip(
        f"no cgroup memory controller: /proc/self/cgroup says {membership!r}; {looked}; "
        "no v1 memory hierarchy in /proc/self/mountinfo"
    )


def memory_cgroup_version() -> int:
    """1 or 2: the version of the hierarchy this process is charged in (skips when none)."""
    return own_memory_group()[0]


def job_group_folder() -> tuple[int, Path]:
    """(version, the folder roomkeeper makes job groups in), made ready as roomkeeper does.

    On cgroup v2 this moves the test process into its leaf first, exactly as
    a scheduler would (kernel/delegation.py).
    """
    if os.geteuid() != 0:
        pytest.skip("creating a memory cgroup needs root (CI runs as root)")
    own_memory_group()  # skips, saying where it looked, without any controller
    place = prepare_job_groups()
    if place.directory is None or place.version is None:
        pytest.skip(f"roomkeeper makes no job groups here: {place.reason}")
    return place.version, Path(place.directory)


def kill_and_remove(group: Path, deadline_s: float = 10.0) -> None:
    """SIGKILL every process in ``group`` and its children (ours: we made it), then rmdir all."""
    deadline = time.monotonic() + deadline_s
    children = sorted((p for p in group.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
    for directory in [*children, group]:
        with contextlib.suppress(OSError):
            (directory / "cgroup.freeze").write_text("0")
        while True:
            with contextlib.suppress(OSError):
                (directory / "cgroup.kill").write_text("1")
            with contextlib.suppress(OSError):
                for pid in (directory / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
            try:
                directory.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


@contextlib.contextmanager
def child_memory_cgroup(limit_bytes: int) -> Iterator[tuple[int, Path]]:
    """A child memory cgroup with a real limit, removed afterwards even when the test fails.

    Made where roomkeeper makes job groups, so that cgroup v2's rules hold
    (its parent holds no processes and has the memory controller on).
    Processes still in the group at the end were started by the test: they
    are killed (by pid from the group's own list, never by name) before the
    group is removed.
    """
    version, folder = job_group_folder()
    group = folder / f"rktest-{uuid.uuid4().hex[:8]}"
    try:
        group.mkdir()
    except OSError as err:
        pytest.skip(f"cannot create a child memory cgroup in {folder}: {err.strerror}")
    try:
        limit_file = "memory.max" if version == 2 else "memory.limit_in_bytes"
        (group / limit_file).write_text(str(limit_bytes))
        yield version, group
    finally:
        kill_and_remove(group)


def cgroup_fs_read_only() -> bool:
    """Whether the cgroup file system is mounted read-only, as Docker and Kubernetes mount it
    in a container by default: no job group can be made, by design of that layout."""
    try:
        return bool(os.statvfs(CGROUP_ROOT).f_flag & os.ST_RDONLY)
    except OSError:
        return False


@dataclass(frozen=True, slots=True)
class MemoryBox:
    """Where a test runs work under a memory limit.

    A child group with a real limit where one can be made; in a container whose
    cgroup file system is read-only, the container itself, with the limit stated
    to roomkeeper (ROOMKEEPER_MEMORY_LIMIT_MB, below the container's own): the
    fallback roomkeeper itself takes there, which is what such a test then checks.

    Attributes:
        version: the cgroup version.
        group: the child group, or the container's own group.
        limit: the limit in bytes: the kernel's, or the one stated (the room asked for
            plus what the container held already).
        made: whether ``group`` is a child group made for the test.
    """

    version: int
    group: Path
    limit: int
    made: bool

    def argv(self, command: list[str], *, leaf: str | None = None) -> list[str]:
        """``command`` run inside the box (joined to the child group first).

        Args:
            leaf: join the box's child group of that name instead (made if need be): on
                cgroup v2 a gateway in the box hands the memory controller to the box's
                children, and from then on no process may join the box itself.
        """
        if not self.made:
            return command
        group = self.group if leaf is None else self.group / leaf
        return [
            "/bin/sh",
            "-c",
            'mkdir -p "$(dirname "$0")" && echo $$ > "$0" && exec "$@"',
            str(group / "cgroup.procs"),
            *command,
        ]

    def env(self) -> dict[str, str]:
        """What roomkeeper is told in the box: the limit, where the kernel's is larger."""
        return {} if self.made else {"ROOMKEEPER_MEMORY_LIMIT_MB": str(self.limit >> 20)}

    def oom_kills(self) -> int:
        """The OOM kills the box's group has counted."""
        return group_oom_kills(self.group, self.version)


@contextlib.contextmanager
def memory_box(limit_bytes: int) -> Iterator[MemoryBox]:
    """A :class:`MemoryBox` of ``limit_bytes``: a child group, removed afterwards even when
    the test fails, or in a read-only layout the container itself (skips when it is
    smaller than the limit with room to spare)."""
    if not cgroup_fs_read_only():
        with child_memory_cgroup(limit_bytes) as (version, group):
            yield MemoryBox(version, group, limit_bytes, made=True)
        return
    version, own = own_memory_group()
    memory = read_pressure_inputs().memory
    # What the container holds already (the test runner itself) is on top of the room the test
    # asked for, as a fresh child group would have it all.
    stated = limit_bytes + memory.used_bytes
    container = memory.limit_bytes
    if container is not None and container < stated + (limit_bytes >> 2):
        roomy = (stated + (limit_bytes >> 2)) >> 20
        pytest.skip(
            f"the container's limit ({container >> 20} MiB) leaves no room above a stated "
            f"{stated >> 20} MiB; run it in a container of {roomy} MiB or more"
        )
    yield MemoryBox(version, own, stated >> 20 << 20, made=False)


@contextlib.contextmanager
def scratch_v2_group() -> Iterator[Path]:
    """An empty cgroup v2 group with the memory controller, for a process to be moved into.

    Skips on a v1 host (its memory controller is not on v2).  Whatever the
    test makes inside is removed with it, its processes killed.
    """
    version, folder = job_group_folder()
    if version != 2:
        pytest.skip("this host's memory controller is on cgroup v1, which has no such rule")
    group = folder / f"rktest-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        yield group
    finally:
        kill_and_remove(group)


def _fs_type(path: Path) -> str:
    """The file system type of the mount that holds ``path`` (mountinfo's longest prefix)."""
    best, fs_type = "", ""
    target = str(path.resolve())
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        mount_point, kind = fields[4], fields[fields.index("-", 6) + 1]
        if (target == mount_point or target.startswith(mount_point.rstrip("/") + "/")) and len(
            mount_point
        ) >= len(best):
            best, fs_type = mount_point, kind
    return fs_type


@contextlib.contextmanager
def ext4_scratch(tmp_path: Path, size_mb: int = 400) -> Iterator[Path]:
    """A fresh ext4 file system on a loop device, mounted; unmounted and removed afterwards.

    Its page cache is a disk's: file pages the kernel can give back (in the
    cgroup v2 VM ``/tmp`` is an overlay on tmpfs, whose pages are shared
    memory, and the root is 9p, which caches nothing).  The image lies in
    ``tmp_path`` where that is a disk; else in ``/dev/shm``, allocated in
    full now, so that its pages are charged to this process and not to the
    group under test when the loop device writes them.
    """
    if os.geteuid() != 0:
        pytest.skip("mounting a loop device needs root (CI runs as root)")
    # modprobe is needed only where loop is a module not loaded yet (the VM's kernel).
    needed = ["mkfs.ext4", "mount", "umount"]
    if not Path("/dev/loop-control").exists():
        needed.append("modprobe")
    missing = [t for t in needed if shutil.which(t) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not found on PATH {os.environ.get('PATH')!r}")
    if not Path("/dev/loop-control").exists():
        subprocess.run(["modprobe", "loop"], check=False, capture_output=True)
    on_disk = _fs_type(tmp_path) in ("ext4", "ext3", "ext2", "xfs", "btrfs")
    image = (tmp_path if on_disk else Path("/dev/shm")) / f"rktest-{uuid.uuid4().hex[:8]}.img"
    mount_point = tmp_path / "ext4"
    mount_point.mkdir()
    try:
        with image.open("wb") as out:
            if on_disk:
                out.truncate(size_mb << 20)  # sparse
            else:
                os.posix_fallocate(out.fileno(), 0, size_mb << 20)
        subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True, capture_output=True)
        mounted = subprocess.run(
            ["mount", "-o", "loop", str(image), str(mount_point)],
            capture_output=True,
            text=True,
            check=False,
        )
        if mounted.returncode != 0:
            pytest.skip(f"cannot mount {image} on a loop device: {mounted.stderr.strip()}")
        try:
            yield mount_point
        finally:
            subprocess.run(["umount", str(mount_point)], check=True)  # frees the loop device
    finally:
        image.unlink(missing_ok=True)


def batch_env(tmp: Path, **extra: str) -> dict[str, str]:
    """The environment for a real ``roomkeeper batch`` in a test: none of the caller's
    ROOMKEEPER_* variables, a fresh home, no CPU gate, no disk asks, this checkout's code."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROOMKEEPER_")}
    env.update(
        ROOMKEEPER_HOME=str(tmp / "home"),
        ROOMKEEPER_CPU_PRESSURE_PERCENT="100",
        ROOMKEEPER_JOB_DISK_MB="0",
        ROOMKEEPER_DISK_HEADROOM_PERCENT="0",
        PYTHONPATH=str(Path(__file__).resolve().parents[1] / "src"),
        **extra,
    )
    return env


# Tests that count the machine's OOM kills (none may escape their group) and the test
# that makes the kernel kill on purpose (the Ray cluster with its node monitors off)
# run in different pytest-xdist workers at once: a kill of one would be counted by the
# other.  The counting ones hold this lock shared, the killing one alone.
KILLS_LOCK = Path(tempfile.gettempdir()) / "roomkeeper-tests-oom-kills.lock"


@contextlib.contextmanager
def _kills_lock(mode: int) -> Iterator[None]:
    with KILLS_LOCK.open("a") as lock:
        fcntl.flock(lock, mode)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextlib.contextmanager
def machine_kills_counted() -> Iterator[Callable[[], int]]:
    """The machine's OOM kills since entry (a function to call), while no test of this suite
    makes the kernel kill on purpose."""
    with _kills_lock(fcntl.LOCK_SH):
        before = machine_oom_kills()
        yield lambda: machine_oom_kills() - before


@contextlib.contextmanager
def kills_on_purpose() -> Iterator[None]:
    """Make the kernel kill inside: no test counting the machine's kills runs meanwhile."""
    with _kills_lock(fcntl.LOCK_EX):
        yield
