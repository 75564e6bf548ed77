"""What a job's build tools read to find its jobserver, and the ``-j`` that would turn it off.

GNU make's protocol has two ways to name the token pipe in ``MAKEFLAGS``:
``--jobserver-auth=R,W`` (inherited descriptors; every make since 4.2, cargo)
and ``--jobserver-auth=fifo:PATH`` (make 4.4 and later, ninja 1.13 and later,
which takes no other form upstream).  Every client reads the *last* auth in the
variable, and make up to 4.3 stops with "invalid --jobserver-auth string" on a
``fifo:`` one, so one order cannot suit both: the pipe form comes last.  Both
name the same FIFO (the descriptors are that FIFO opened twice), so the two
styles share one pool.  A command that runs ninja (or samu) gets the
FIFO form alone and no descriptors: it takes no other form, and it passes
descriptors it did not open on to every step it runs, where they would make
each step look like a client of the pool.  ninja is found as any word of the
command (``cd build && ninja``) and behind ``cmake --build DIR`` whose
``DIR/CMakeCache.txt`` names a Ninja generator.  Cargo reads
``CARGO_MAKEFLAGS`` before ``MAKEFLAGS``; it gets the FIFO form, which needs
no descriptor to survive a wrapper.

A client started with its own ``-j`` (or cargo with ``CARGO_BUILD_JOBS``,
``cmake --build`` with ``CMAKE_BUILD_PARALLEL_LEVEL``) runs its own count and
ignores the jobserver: those are taken out of the command, and each removal is
said in a note.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

FIFO_ONLY = frozenset({"ninja", "samu"})
"""Programs whose jobserver client takes only the FIFO form (ninja 1.13 upstream)."""

_TOOLS = frozenset({"make", "gmake", "ninja", "samu", "cargo", "cmake"})
_JOB_COUNT_VARIABLES = ("CARGO_BUILD_JOBS", "CMAKE_BUILD_PARALLEL_LEVEL")
_SHELL_SYNTAX = re.compile(r"[;&|<>()`$\n]")
_J_WORD = re.compile(r"^(-j\d*|--jobs(=\d*)?|--parallel(=\d*)?)$")


@dataclass(frozen=True, slots=True)
class Auth:
    """Where a job's token pool is: the FIFO's path and the inherited descriptors on it."""

    fifo_path: str
    read_fd: int
    write_fd: int


@dataclass(frozen=True, slots=True)
class Command:
    """A job's command as it runs under a jobserver, and what was changed in it, in words.

    Attributes:
        argv: the command.
        env: its environment.
        notes: what was changed, in words.
        descriptors: whether it inherits the pool's descriptors (not for a FIFO-only tool).
    """

    argv: list[str]
    env: dict[str, str]
    notes: list[str]
    descriptors: bool = True


def makeflags(auth: Auth, *, fifo_only: bool, inherited: str = "") -> str:
    """``MAKEFLAGS`` naming the pool in both styles, the pipe form last; or the FIFO alone.

    Args:
        auth: the pool.
        fifo_only: name the FIFO form alone (a client that reads only that form, and is
            given no descriptors).
        inherited: the job's own ``MAKEFLAGS``; its auths and ``-j`` words are dropped.
    """
    pipe = f"--jobserver-auth={auth.read_fd},{auth.write_fd}"
    fifo = f"--jobserver-auth=fifo:{auth.fifo_path}"
    kept = [w for w in inherited.split() if not _jobserver_word(w)]
    # " -j" first, as make itself writes it: a first word without a dash is read as flag letters.
    auths = [fifo] if fifo_only else [fifo, pipe]
    return " ".join(["", "-j", *kept, *auths])


def _jobserver_word(word: str) -> bool:
    return word.startswith(("--jobserver-auth=", "--jobserver-fds=")) or bool(
        re.fullmatch(r"-j\d*", word)
    )


def _words(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:
        return []


def runs_ninja(argv: Sequence[str], *, shell: bool, cwd: str | None = None) -> bool:
    """Whether the command runs a FIFO-only client: ninja or samu named anywhere in it, or
    ``cmake --build DIR`` over a tree configured for a Ninja generator (``DIR`` from ``cwd``,
    the job's working directory)."""
    if shell:
        marked = _programs_and_args(argv[0])
        programs = [w for w, first in marked if first]
        words = [w for w, _ in marked]
    else:
        programs, words = list(argv[:1]), list(argv)
    if any(os.path.basename(w) in FIFO_ONLY for w in programs):
        return True
    for index, word in enumerate(words[:-2]):
        if os.path.basename(word) == "cmake" and words[index + 1] == "--build":
            tree = os.path.join(cwd or os.getcwd(), words[index + 2])
            if _cache_generator(tree).startswith("Ninja"):
                return True
    return False


_WRAPPERS = frozenset({"env", "exec", "time", "nice", "command", "nohup"})


def _programs_and_args(text: str) -> list[tuple[str, bool]]:
    """Shell text's words, each with whether it is the program of a simple command (the first
    word after ``&&``, ``;``, ``|``, ``(``, past ``VAR=x`` and wrappers such as ``env``)."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:
        return []
    out: list[tuple[str, bool]] = []
    expect = True
    for token in tokens:
        if token and set(token) <= set("();&|<>"):
            expect = True
            continue
        if expect and ("=" in token.split("/")[0] or os.path.basename(token) in _WRAPPERS):
            out.append((token, False))
            continue
        out.append((token, expect))
        expect = False
    return out


def _cache_generator(tree: str) -> str:
    """The generator a CMake build tree was configured with; "" when it cannot be read."""
    try:
        with open(os.path.join(tree, "CMakeCache.txt"), encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("CMAKE_GENERATOR:"):
                    return line.partition("=")[2].strip()
    except OSError:
        pass
    return ""


def prepare_command(
    argv: Sequence[str],
    env: Mapping[str, str],
    auth: Auth,
    *,
    shell: bool,
    cwd: str | None = None,
) -> Command:
    """The command and environment a job runs with under the pool at ``auth``.

    Removes every ``-j`` a known build tool would take as its own count (from
    argv, or from shell text that is one plain command) and the variables that
    set one; a ``-j`` left in shell text that is more than one command is said,
    not touched.
    """
    notes: list[str] = []
    new_env = dict(env)
    for name in _JOB_COUNT_VARIABLES:
        if name in new_env:
            notes.append(f"removed {name}={new_env.pop(name)}: it sets a count of its own")
    new_argv = [_shell_without_j(argv[0], notes)] if shell else _without_j(list(argv), notes)
    fifo_only = runs_ninja(new_argv, shell=shell, cwd=cwd)
    new_env["MAKEFLAGS"] = makeflags(
        auth, fifo_only=fifo_only, inherited=new_env.get("MAKEFLAGS", "")
    )
    new_env["CARGO_MAKEFLAGS"] = f"-j --jobserver-auth=fifo:{auth.fifo_path}"
    new_env.pop("MFLAGS", None)  # make writes it from MAKEFLAGS; an old copy would disagree
    return Command(new_argv, new_env, notes, descriptors=not fifo_only)


def _shell_without_j(text: str, notes: list[str]) -> str:
    words = _words(text)
    if not words or _SHELL_SYNTAX.search(text):
        if any(_J_WORD.match(w) for w in text.split()):
            notes.append(
                "a -j in this shell text may turn the jobserver off for its tool; "
                "it is more than one plain command, so it was left as written: remove it"
            )
        return text
    rewritten = _without_j(words, notes)
    return text if rewritten == words else shlex.join(rewritten)


def _without_j(words: list[str], notes: list[str]) -> list[str]:
    """``words`` less each ``-j N``, ``-jN``, ``--jobs[=N]``, ``--parallel[=N]`` after a known
    build tool (``cmake --build`` passes its ``-j`` on to make or ninja)."""
    if not words or os.path.basename(words[0]) not in _TOOLS:
        return words
    kept: list[str] = []
    index = 1
    while index < len(words):
        word = words[index]
        taken = [word]
        if _J_WORD.match(word):
            bare = word in ("-j", "--jobs", "--parallel")
            if bare and index + 1 < len(words) and words[index + 1].isdigit():
                taken.append(words[index + 1])
            index += len(taken)
            notes.append(
                f"removed {' '.join(taken)!r}: an explicit -j turns the jobserver off "
                "(the tool would run its own count)"
            )
            continue
        kept.append(word)
        index += 1
    return [words[0], *kept]
