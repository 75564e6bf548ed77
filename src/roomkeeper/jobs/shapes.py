"""Command shapes: what a job runs, without the arguments it runs it with.

Lines that run the same program with other arguments are different kinds,
yet alike more often than not: twenty agent turns with twenty prompts, a
test runner given one file each.  A line's shape is, for each simple
command in it, the program and, for an interpreter or a tool whose first
word names the work, its script or subcommand::

    python grow.py 3 4                ->  python grow.py
    FOO=1 nice -n 5 python -u a.py    ->  python a.py
    python -m pytest -x tests/a.py    ->  python -m pytest
    cd sub && make test > out.log     ->  cd make
    cargo +nightly build -p crate     ->  cargo build

Assignments, wrappers that only change how a command runs (``env``,
``nice``, ``timeout``, ``time`` ...), redirections, comments and the words
of ``if``/``while`` are left out.  No shape is told (None) where the text
is all there is to tell the work by: inline code (``python -c``, ``bash
-lc``, ``perl -ne``, ``node --eval=...``), a ``for``/``case`` loop, text
that does not parse (an open quote).  Pure: nothing here reads a file.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class _Runner:
    """How a program that runs other work reads its options.

    Attributes:
        inline: options whose value is code to run (the line is then all there is).
        inline_cluster: letters that, ending a cluster of one-letter options
            (``-lc``, ``-ne``), make it inline code; empty for none.
        valued: options whose value is the next word (``-W ignore``), not the script.
        subcommand: a tool named by its first word (``cargo build``), not a script.
    """

    inline: frozenset[str] = frozenset()
    inline_cluster: str = ""
    valued: frozenset[str] = frozenset()
    subcommand: bool = False


_PYTHON = _Runner(frozenset({"-c"}), "c", frozenset({"-W", "-X", "-Q"}))
_SHELL = _Runner(frozenset({"-c"}), "c", frozenset({"-o", "+o", "-O", "+O"}))
_NODE = _Runner(
    frozenset({"-e", "-p", "--eval", "--print"}),
    "",
    frozenset({"-r", "--require", "--import", "--loader", "-C", "--conditions"}),
)
_PERL = _Runner(frozenset({"-e", "-E"}), "eE", frozenset({"-I", "-M", "-m"}))
_RUBY = _Runner(frozenset({"-e"}), "e", frozenset({"-I", "-r"}))
_EVAL = _Runner(frozenset({"-e", "-E"}), "")  # Rscript, julia, lua
_TOOL = _Runner(subcommand=True)

RUNNERS: dict[str, _Runner] = {
    "python": _PYTHON,
    "pypy": _PYTHON,
    **dict.fromkeys(("bash", "sh", "dash", "zsh", "ksh"), _SHELL),
    **dict.fromkeys(("node", "nodejs"), _NODE),
    "perl": _PERL,
    "ruby": _RUBY,
    "php": _Runner(frozenset({"-r"}), "", frozenset({"-d", "-c"})),
    **dict.fromkeys(("Rscript", "julia", "lua", "tclsh"), _EVAL),
    **dict.fromkeys(("uv", "npx", "npm", "pnpm", "yarn", "cargo", "go", "deno", "bun"), _TOOL),
}
"""Programs whose first argument that is not an option names the work, by base name
(a version suffix dropped: ``python3.11`` is ``python``)."""

WRAPPERS: dict[str, frozenset[str]] = {
    **dict.fromkeys(("env", "nohup", "stdbuf", "exec", "command", "builtin"), frozenset()),
    **dict.fromkeys(("time", "taskset", "chrt", "setsid"), frozenset()),
    "nice": frozenset({"-n"}),
    "ionice": frozenset({"-c", "-n", "-p"}),
    "timeout": frozenset({"-s", "-k", "--signal", "--kill-after"}),
    "sudo": frozenset({"-u", "-g", "-C", "-D", "-h", "-p", "-U"}),
    "xargs": frozenset({"-I", "-d", "-a", "-E", "-L", "-n", "-P", "-s"}),
}
"""Programs that run the rest of their words as a command, changing only how it runs, and
their options whose value is the next word (``sudo -u bob``)."""

_LEADING_KEYWORDS = frozenset(
    {"!", "{", "}", "if", "then", "else", "elif", "fi", "while", "until", "do", "done", "esac"}
)
_NO_SHAPE_KEYWORDS = frozenset({"for", "case", "select", "function", "coproc"})
_OPERATOR_PIECES = re.compile(r";;|&&|\|\||\|&|[;&|()]")
_PUNCTUATION = frozenset("();<>|&")
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_WRAPPER_ARGUMENT = re.compile(r"[0-9][0-9.,:x-]*[a-z]?")  # timeout 10s, nice 5, taskset 0-3
_VERSION_SUFFIX = re.compile(r"[0-9.]+$")


def command_shape(words: Sequence[str]) -> tuple[str, ...] | None:
    """The shape of one argv (no shell in between): its program and what it runs."""
    return _simple_shape(list(words)) or None


def shell_shape(text: str) -> tuple[str, ...] | None:
    """The shape of shell text: each simple command's, in order (None: no shape)."""
    try:
        # Lines end commands as ";" does (a newline in quotes only changes an argument).
        lexer = shlex.shlex(text.replace("\n", " ; "), posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = list(lexer)
    except ValueError:  # an open quote or a trailing escape
        return None
    shape: list[str] = []
    for command in _simple_commands(tokens):
        part = _simple_shape(command)
        if part is None:
            return None
        shape.extend(part)
    return tuple(shape) or None


def _simple_commands(tokens: Sequence[str]) -> list[list[str]]:
    """The words of each simple command, operators and redirections (with their files) out."""
    commands: list[list[str]] = [[]]
    skip_next = False
    for i, token in enumerate(tokens):
        if skip_next:  # the file a redirection names is no part of the command
            skip_next = False
            continue
        if token and set(token) <= _PUNCTUATION:
            if "<" in token or ">" in token:
                skip_next = True
            else:  # shlex joins adjacent operators: ")&&" is two
                commands.extend([] for _ in _OPERATOR_PIECES.findall(token))
            continue
        following = tokens[i + 1] if i + 1 < len(tokens) else ""
        if token.isdigit() and following[:1] in ("<", ">"):
            continue  # the descriptor of "2>err"
        commands[-1].append(token)
    return [c for c in commands if c]


def _simple_shape(words: list[str]) -> tuple[str, ...] | None:
    """One simple command's program and what it runs; () for none, None for no shape."""
    rest = list(words)
    while rest:
        word = rest[0]
        if word in _NO_SHAPE_KEYWORDS:
            return None
        if word in _LEADING_KEYWORDS or _ASSIGNMENT.match(word):
            rest.pop(0)
        elif os.path.basename(word) in WRAPPERS:
            valued = WRAPPERS[os.path.basename(rest.pop(0))]
            while rest and (
                rest[0].startswith("-")
                or _ASSIGNMENT.match(rest[0])
                or _WRAPPER_ARGUMENT.fullmatch(rest[0])
            ):
                if rest.pop(0) in valued and rest:
                    rest.pop(0)  # "-u bob": the option's value
        else:
            break
    if not rest:
        return ()
    program, args = rest[0], rest[1:]
    runner = RUNNERS.get(_VERSION_SUFFIX.sub("", os.path.basename(program)))
    if runner is None:
        return (program,)
    return _what_it_runs(program, args, runner)


def _what_it_runs(program: str, args: Sequence[str], runner: _Runner) -> tuple[str, ...] | None:
    """``program`` and its script, module or subcommand; None where it runs inline code."""
    words = iter(args)
    for arg in words:
        if arg.split("=", 1)[0] in runner.inline:  # "-c" or "--eval=CODE"
            return None
        if (
            runner.inline_cluster
            and re.fullmatch(r"-[A-Za-z]+", arg)
            and arg[-1] in runner.inline_cluster
        ):
            return None
        if arg == "-m" and runner is _PYTHON:  # python -m MODULE: the module is the script
            return (program, arg, next(words, ""))
        if arg in runner.valued:
            next(words, None)
        elif not arg.startswith(("-", "+")):
            return (program, arg)
    return (program,)
