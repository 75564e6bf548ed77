"""Command shapes: a line's program and what it runs, without its arguments; shown."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from roomkeeper.batch.run import BatchResult
from roomkeeper.cli.batch_view import summary_table
from roomkeeper.jobs.shapes import command_shape, shell_shape
from roomkeeper.jobs.spec import EstimateSource, JobState


@pytest.mark.parametrize(
    ("line", "shape"),
    [
        ("python3 grow.py 850000000 12.5", ("python3", "grow.py")),
        ("/usr/bin/python3.11 -u grow.py 5", ("/usr/bin/python3.11", "grow.py")),
        ("python -m pytest -x tests/test_a.py", ("python", "-m", "pytest")),
        ("python -W ignore x.py", ("python", "x.py")),  # an option's value is no script
        ("python -E x.py", ("python", "x.py")),
        ("FOO=1 BAR='a b' make -j4 test", ("make",)),
        ("true", ("true",)),
        ("claude -p 'fix the bug' #kind", ("claude",)),
    ],
)
def test_a_lines_shape_is_its_program_and_what_an_interpreter_runs(
    line: str, shape: tuple[str, ...]
) -> None:
    """Arguments, assignments and comments are no part of it; a script or module is."""
    assert shell_shape(line) == shape


@pytest.mark.parametrize(
    ("line", "shape"),
    [
        ("cd sub && make test > out.log 2>&1", ("cd", "make")),
        ("< in.txt node tool.js --fast | sort", ("node", "tool.js", "sort")),
        ("2>err python x.py", ("python", "x.py")),  # the descriptor of a redirection
        ("(cd a; make)&&python x.py 1", ("cd", "make", "python", "x.py")),  # joined operators
        ("make;(python x.py)", ("make", "python", "x.py")),
        ("{ python a.py; }", ("python", "a.py")),
        ("if test -f x; then python a.py; fi", ("test", "python", "a.py")),
    ],
)
def test_each_command_of_a_line_has_its_part(line: str, shape: tuple[str, ...]) -> None:
    """Operators, joined or not, end commands; redirections and shell words are no part."""
    assert shell_shape(line) == shape


@pytest.mark.parametrize(
    "line",
    [
        "time python a.py 1",
        "env -i FOO=1 nice -n 5 python -u a.py 3",
        "nice -n 5 timeout -s KILL 10s python a.py",
        "sudo -u bob python a.py",
        "xargs -I {} python a.py {}",
    ],
)
def test_wrappers_that_only_change_how_a_command_runs_are_left_out(line: str) -> None:
    """With their options and the options' values: what they run is the shape."""
    assert shell_shape(line) == ("python", "a.py")


@pytest.mark.parametrize(
    ("line", "shape"),
    [
        ("cargo +nightly build -p crate", ("cargo", "build")),
        ("go test ./...", ("go", "test")),
        ("npx jest a.test.js", ("npx", "jest")),
        ("sh -e script.sh", ("sh", "script.sh")),  # -e is no inline code to a shell
        ("bash -o pipefail s.sh", ("bash", "s.sh")),
        ("node -r ts-node/register a.ts", ("node", "a.ts")),
    ],
)
def test_a_tool_is_named_by_its_subcommand_and_options_are_read_per_program(
    line: str, shape: tuple[str, ...]
) -> None:
    """A toolchain (+nightly) or an option's value is no subcommand or script."""
    assert shell_shape(line) == shape


@pytest.mark.parametrize(
    "line",
    [
        "python -c 'print(1)'",
        "python -Sc 'print(1)'",
        "bash -lc 'make test'",
        "perl -ne 'print'",
        "ruby -e 'p 1'",
        "node -e 'x'",
        "node --eval=1",
        "php -r 'echo 1;'",
        "for f in *.py; do python $f; done",
        "echo 'an open quote",
        "",
        ";",
        "FOO=1",
        "> out.log",
    ],
)
def test_no_shape_where_the_text_is_all_there_is(line: str) -> None:
    """Inline code, a loop over names, text that does not parse, or no command at all."""
    assert shell_shape(line) is None


def test_an_argv_has_a_shape_of_its_own_command() -> None:
    """No shell in between: the words are the command, as given."""
    assert command_shape(["nice", "-n", "3", "python3", "a.py", "x"]) == ("python3", "a.py")
    assert command_shape(["python3", "-c", "pass"]) is None
    assert command_shape(["env"]) is None


@given(st.text(max_size=200))
def test_any_text_gives_a_shape_or_none_never_an_error(text: str) -> None:
    """A batch line or a job's text never fails a submission here."""
    shape = shell_shape(text)
    assert shape is None or (shape and all(isinstance(w, str) for w in shape))


def test_the_summary_shows_a_shapes_figure_only_beside_a_default_estimate() -> None:
    """A re-run's estimate is its own run's: the shape sized nothing there."""
    base = BatchResult(1, "python a.py", JobState.EXITED, 0, 1.0, 10**8, "/l", None, 10**9)
    guessed = replace(base, shape_bytes=3 * 10**8)
    rerun = replace(guessed, line=2, estimate_source=EstimateSource.RERUN)
    table = summary_table([guessed, rerun, replace(base, line=3)], 1.0)
    rows = {line.split()[0]: line for line in table.splitlines() if line.split()[:1] != ["#"]}
    assert rows["1"].endswith("1.0 GB (default; shape 300.0 MB)"), table
    assert rows["2"].endswith("1.0 GB (re-run)") and rows["3"].endswith("1.0 GB (default)")
