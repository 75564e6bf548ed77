"""Where roomkeeper keeps its state: ROOMKEEPER_HOME, the workspace volume, the token."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import NoReturn

from roomkeeper.errors import UnwritablePlaceError, UsageError

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

    The design's default is ROOMKEEPER_HOME itself; we use a folder inside it
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


def validate_home(path: Path, *, searchable: bool = False) -> None:
    """Refuse a ROOMKEEPER_HOME another user could have planted or can change; tighten its mode.

    The home holds the token and the journal: it must be a real directory (a
    symbolic link is not followed), ours, and writable by nobody else, or
    another local user could swap the token or the journal under us.  A home
    that others can read (systemd's ``StateDirectory=`` alone makes 0755) is
    made 0700, and so is its ``logs/``; the repair is logged.

    Args:
        path: ROOMKEEPER_HOME.
        searchable: leave others search (``x``) access (0711), so that a
            separate job user reaches its workspace inside the home by path;
            it still cannot list the home nor read anything in it.

    Raises:
        UsageError: ``name="ROOMKEEPER_HOME"``; the message says what is
            wrong and the command that fixes it.  It is logged too.
    """
    try:
        st = os.lstat(path)
    except OSError as err:
        _refuse(f"ROOMKEEPER_HOME {path} cannot be read: {err.strerror}", "ROOMKEEPER_HOME")
    if stat.S_ISLNK(st.st_mode):
        _refuse(
            f"ROOMKEEPER_HOME {path} is a symbolic link (to {os.readlink(path)}); "
            "set ROOMKEEPER_HOME to the real directory",
            "ROOMKEEPER_HOME",
        )
    if not stat.S_ISDIR(st.st_mode):
        _refuse(
            f"ROOMKEEPER_HOME {path} is not a directory; remove it: rm {path}", "ROOMKEEPER_HOME"
        )
    _check_ours(path, st, "ROOMKEEPER_HOME", f"chown {os.geteuid()} {path}")
    if st.st_mode & 0o022:
        _refuse(
            f"ROOMKEEPER_HOME {path} is writable by other users (mode "
            f"{stat.S_IMODE(st.st_mode):04o}): they could replace the token or the journal; "
            f"fix it with: chmod 700 {path}",
            "ROOMKEEPER_HOME",
        )
    _tighten(path, st, 0o711 if searchable else 0o700)
    with contextlib.suppress(FileNotFoundError):
        logs = path / "logs"
        logs_st = os.lstat(logs)
        if stat.S_ISDIR(logs_st.st_mode) and logs_st.st_uid == os.geteuid():
            _tighten(logs, logs_st, 0o700)  # made 0755 by an older roomkeeper


def _check_ours(path: Path, st: os.stat_result, name: str, fix: str) -> None:
    if st.st_uid != os.geteuid():
        _refuse(
            f"{path} belongs to uid {st.st_uid}, not to roomkeeper's uid {os.geteuid()}: "
            f"another user made it; fix it with: {fix}",
            name,
        )


def _tighten(path: Path, st: os.stat_result, wanted: int) -> None:
    """Give a directory of ours exactly ``wanted`` for group and others, logging the repair."""
    current = stat.S_IMODE(st.st_mode)
    if current & 0o077 != wanted & 0o077:
        os.chmod(path, (current & 0o700) | (wanted & 0o077), follow_symlinks=False)
        log.warning("%s was mode %04o; made it %04o", path, current, wanted)


def _refuse(message: str, name: str) -> NoReturn:
    log.error("%s", message)
    raise UsageError(message, name=name)


def load_token(home: Path) -> str:
    """The gateway's bearer token, made on first start (mode 0600).

    Written to a temporary file and renamed, so a crash never leaves an empty
    token behind; a token file that is empty or too short is replaced, since
    an empty token would let anyone in.  An existing token is opened with
    ``O_NOFOLLOW`` and must be a regular file of ours, mode 0600: one that is
    a link, another user's, or readable by others may be known to someone
    else, and is refused (logged, and the message says how to make a new one).

    Raises:
        UsageError: ``name="token"``: the token file is not one we can trust.
    """
    path = home / "token"
    token = _read_token(path)
    if token is not None and len(token) >= MIN_TOKEN_CHARS:
        return token
    if token is not None:
        log.warning("the token file was empty or too short; a new token was made")
    write_private(path, secrets.token_urlsafe(32) + "\n")
    return _read_token(path) or ""


def _read_token(path: Path) -> str | None:
    """The token file's text, None when there is none; refused unless ours, regular and 0600."""
    fix = f"remove it (rm {path}) and start again: a new token is made"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as err:  # ELOOP: a symbolic link, not followed
        _refuse(f"the token {path} cannot be opened safely ({err.strerror}); {fix}", "token")
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            _refuse(f"the token {path} is not a regular file; {fix}", "token")
        _check_ours(path, st, "token", f"rm {path} (a new token is made at start)")
        text = f.read(4096).decode(errors="replace").strip()
        if len(text) < MIN_TOKEN_CHARS:
            return text  # no secret in it to have leaked: the caller replaces it (0600)
        if stat.S_IMODE(st.st_mode) != 0o600:
            _refuse(
                f"the token {path} is mode {stat.S_IMODE(st.st_mode):04o}, not 0600, so others "
                f"may have read it; {fix}",
                "token",
            )
        return text
