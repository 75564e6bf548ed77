"""Where roomkeeper keeps its state: ROOMKEEPER_HOME, the workspace volume, the token."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import tempfile
from collections.abc import Mapping
from pathlib import Path

from roomkeeper.errors import UnwritablePlaceError

log = logging.getLogger("roomkeeper")

MIN_TOKEN_CHARS = 32


def home_dir(env: Mapping[str, str] | None = None, *, create: bool = True) -> Path:
    """ROOMKEEPER_HOME, else ``$XDG_STATE_HOME/roomkeeper``, else ``~/.local/state/roomkeeper``.

    Args:
        env: the environment to read; ``os.environ`` when omitted.
        create: make the directory (mode 0700) if it does not exist yet; it
            holds the journal and, later, the gateway's token.
    """
    env = os.environ if env is None else env
    if env.get("ROOMKEEPER_HOME"):
        path = Path(env["ROOMKEEPER_HOME"]).expanduser()
    elif env.get("XDG_STATE_HOME"):
        path = Path(env["XDG_STATE_HOME"]).expanduser() / "roomkeeper"
    else:
        path = Path(env.get("HOME") or Path.home()).expanduser() / ".local/state/roomkeeper"
    if create:
        writable_dir(
            path, what="ROOMKEEPER_HOME", fix="choose another place with ROOMKEEPER_HOME=DIR"
        )
    return path


def writable_dir(path: Path, *, what: str, fix: str) -> Path:
    """Make ``path`` (mode 0700) if needed and prove it takes a file; say what is wrong if not.

    A directory can exist and still refuse writes (a read-only volume, where
    even root cannot write): a small file is created and removed to know.

    Raises:
        UnwritablePlaceError: it cannot be made or written; the message says
            what it is for, the system's reason, and ``fix``.
    """
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".roomkeeper-probe-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise UnwritablePlaceError(
            f"cannot write {what} {path}: {err.strerror or err}; {fix}",
            path=str(path),
            name=what,
        ) from None
    return path


def workspace_dir(env: Mapping[str, str] | None = None) -> Path:
    """ROOMKEEPER_WORKSPACE, else ``ROOMKEEPER_HOME/workspace``: the volume the guard judges.

    DESIGN.md's default is ROOMKEEPER_HOME itself; we use a folder inside it
    (the same volume, so the guard judges the same disk) because the
    gateway's token lies in ROOMKEEPER_HOME and must never lie under the
    workspace, where an agent's tool command could find it.  The workspace
    is not created here: a directory that does not exist yet is judged at
    its nearest existing parent (see :func:`roomkeeper.kernel.resources.read_disk`).
    """
    env = os.environ if env is None else env
    if env.get("ROOMKEEPER_WORKSPACE"):
        return Path(env["ROOMKEEPER_WORKSPACE"]).expanduser()
    return home_dir(env, create=False) / "workspace"


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, mode 0600: temp file, fsync, rename, fsync the folder.

    Raises:
        OSError: nothing was replaced (the old file, if any, is intact).
    """
    directory = path.parent
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    temporary = directory / f".{path.name}.{os.getpid()}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        fd = os.open(temporary, flags, 0o600)
        try:
            os.fchmod(fd, 0o600)  # exactly 0600, whatever the umask
            data = text.encode()
            while data:
                data = data[os.write(fd, data) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)  # the rename itself is durable only once the folder is
    finally:
        os.close(dir_fd)


def load_token(home: Path) -> str:
    """The gateway's bearer token, made on first start (mode 0600).

    Written to a temporary file and renamed, so a crash never leaves an empty
    token behind; a token file that is empty or too short is replaced, since
    an empty token would let anyone in.
    """
    path = home / "token"
    with contextlib.suppress(FileNotFoundError):
        token = path.read_text().strip()
        if len(token) >= MIN_TOKEN_CHARS:
            return token
        log.warning("the token file was empty or too short; a new token was made")
    write_private(path, secrets.token_urlsafe(32) + "\n")
    return path.read_text().strip()
