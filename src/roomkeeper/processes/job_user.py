"""The user managed jobs run as: ``ROOMKEEPER_JOB_USER`` (and ``ROOMKEEPER_JOB_GROUP``).

Jobs run as the gateway's own user unless roomkeeper runs as root and a job
user is named: then every managed job runs as that user, which can read
neither the token, nor the journal, nor other jobs' logs (ROOMKEEPER_HOME and
``logs/`` are root's, 0700 and 0600), only its own workspace.

The privileges are dropped by ``setpriv`` as the innermost step of the
launch command (after the cgroup trampoline), not by
``subprocess``'s ``user=``: joining the job's cgroup writes a root-owned
``cgroup.procs``, which the job user could not do itself.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from roomkeeper.errors import UsageError


@dataclass(frozen=True, slots=True)
class JobUser:
    """Who managed jobs run as.

    Attributes:
        name: the user's name.
        uid: its user id.
        gid: the group id jobs run with (no supplementary groups).
        setpriv: the ``setpriv`` that drops privileges before the job's command.
    """

    name: str
    uid: int
    gid: int
    setpriv: str

    def command(self, argv: list[str]) -> list[str]:
        """``argv``, run as this user and group with no other groups."""
        return [
            self.setpriv,
            f"--reuid={self.uid}",
            f"--regid={self.gid}",
            "--clear-groups",
            "--",
            *argv,
        ]

    def own(self, directory: Path) -> Path:
        """Make ``directory`` (0700) if need be and give it to this user: its workspace."""
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chown(directory, self.uid, self.gid, follow_symlinks=False)
        os.chmod(directory, 0o700, follow_symlinks=False)
        return directory


def read_job_user(env: Mapping[str, str], *, euid: int | None = None) -> JobUser | None:
    """The job user ``env`` names, None when jobs run as the gateway's own user.

    Raises:
        UsageError: the user or group does not exist, roomkeeper is not root (only
            root can run jobs as another user), or ``setpriv`` is missing.
    """
    name = env.get("ROOMKEEPER_JOB_USER", "").strip()
    if not name:
        return None
    if (os.geteuid() if euid is None else euid) != 0:
        raise UsageError(
            f"ROOMKEEPER_JOB_USER={name} needs roomkeeper to run as root; "
            "unset it, or start roomkeeper as root",
            name="ROOMKEEPER_JOB_USER",
        )
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise UsageError(
            f"ROOMKEEPER_JOB_USER={name}: no such user; create it "
            f"(useradd --system --no-create-home {name}) or name another",
            name="ROOMKEEPER_JOB_USER",
        ) from None
    if entry.pw_uid == 0:
        raise UsageError("ROOMKEEPER_JOB_USER must not be root", name="ROOMKEEPER_JOB_USER")
    gid = entry.pw_gid
    group = env.get("ROOMKEEPER_JOB_GROUP", "").strip()
    if group:
        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            raise UsageError(
                f"ROOMKEEPER_JOB_GROUP={group}: no such group; create it or name another",
                name="ROOMKEEPER_JOB_GROUP",
            ) from None
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise UsageError(
            "ROOMKEEPER_JOB_USER needs setpriv (util-linux) on PATH; install util-linux",
            name="ROOMKEEPER_JOB_USER",
        )
    return JobUser(name=name, uid=entry.pw_uid, gid=gid, setpriv=setpriv)
