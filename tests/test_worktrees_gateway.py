"""Worktrees through the gateway and the command line: the API field, GET /v1/workspaces,
``roomkeeper reap``, ``roomkeeper batch --worktree``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from roomkeeper.cli.worktrees import parse_worktree
from roomkeeper.config import read_reap_at_percent
from roomkeeper.errors import UsageError
from roomkeeper.journal.database import Journal
from tests.gateways import gateway_env, roomkeeper_cli, running_gateway, wait_until
from tests.worktree_repos import git, git_identity, repo, small_fs

pytestmark = pytest.mark.kernel

__all__ = ["git_identity", "repo", "small_fs"]  # fixtures, used by name


def test_a_job_runs_in_its_tree_and_the_tree_is_listed_then_reaped(
    tmp_path: Path, small_fs: Path, repo: Path
) -> None:
    """POST a job with a worktree; GET /v1/workspaces; the CLI's dry run, then its reap."""
    with running_gateway(tmp_path / "gw", ROOMKEEPER_WORKSPACE=str(small_fs)) as gw:
        answer = gw.client.post(
            "/v1/jobs",
            json={
                "argv": ["git", "status", "--short", "--branch"],
                "worktree": {"repo": str(repo)},
            },
        )
        assert answer.status_code == 201, answer.text
        job_id = answer.json()["id"]
        wait_until(
            lambda: gw.client.get(f"/v1/jobs/{job_id}").json()["state"] == "exited", "the job's end"
        )
        assert gw.client.get(f"/v1/jobs/{job_id}").json()["worktree"] == {
            "repo": str(repo),
            "branch": None,
        }
        output = gw.client.get(f"/v1/jobs/{job_id}/output").text
        assert f"roomkeeper/{job_id}" in output
        listed = gw.client.get("/v1/workspaces")
        assert listed.status_code == 200
        wait_until(
            lambda: gw.client.get("/v1/workspaces").json()[0]["state"] == "exited", "the row's end"
        )
        (tree,) = gw.client.get("/v1/workspaces").json()
        assert (tree["job_id"], tree["branch"], tree["protection"]) == (
            job_id,
            f"roomkeeper/{job_id}",
            None,
        )
        assert tree["size_bytes"] > 0 and Path(tree["path"]).is_dir()
        env = gateway_env(tmp_path / "gw", ROOMKEEPER_WORKSPACE=str(small_fs))
        dry = roomkeeper_cli(env, "reap", "--dry-run")
        assert dry.returncode == 0, dry.stderr
        assert f"would remove {tree['path']}" in dry.stdout and Path(tree["path"]).is_dir()
        done = roomkeeper_cli(env, "reap")
        assert done.returncode == 0, done.stderr
        assert "removed 1 tree(s)" in done.stderr and not Path(tree["path"]).exists()
        assert gw.client.get("/v1/workspaces").json() == []
        codes = [e["code"] for e in gw.client.get("/v1/history").json()]
        assert "workspaces_reaped" in codes


def test_what_cannot_make_a_tree_is_a_422_with_its_reason(
    tmp_path: Path, small_fs: Path, repo: Path
) -> None:
    """Not a repository, a branch checked out elsewhere, cwd beside worktree: refused at once."""
    with running_gateway(tmp_path / "gw", ROOMKEEPER_WORKSPACE=str(small_fs)) as gw:
        answer = gw.client.post(
            "/v1/jobs", json={"argv": ["true"], "worktree": {"repo": str(tmp_path)}}
        )
        assert (answer.status_code, answer.json()["reason"]) == (422, "not_a_repository")
        answer = gw.client.post(
            "/v1/jobs", json={"argv": ["true"], "worktree": {"repo": str(repo), "branch": "main"}}
        )
        assert (answer.status_code, answer.json()["reason"]) == (422, "branch_checked_out")
        answer = gw.client.post(
            "/v1/jobs", json={"argv": ["true"], "cwd": "/", "worktree": {"repo": str(repo)}}
        )
        assert (answer.status_code, answer.json()["reason"]) == (422, "invalid_request")
        answer = gw.client.post(
            "/v1/jobs", json={"argv": ["true"], "worktree": {"repo": str(repo), "extra": 1}}
        )
        assert (answer.status_code, answer.json()["reason"]) == (422, "invalid_request")


def test_a_protected_tree_says_why_it_stays(tmp_path: Path, small_fs: Path, repo: Path) -> None:
    """A job that leaves an untracked file: its tree stays, and the dry run says why."""
    with running_gateway(tmp_path / "gw", ROOMKEEPER_WORKSPACE=str(small_fs)) as gw:
        answer = gw.client.post(
            "/v1/jobs",
            json={
                "argv": ["sh", "-c", "echo finding > notes.txt"],
                "worktree": {"repo": str(repo)},
            },
        )
        job_id = answer.json()["id"]
        wait_until(
            lambda: gw.client.get(f"/v1/jobs/{job_id}").json()["state"] == "exited", "the job's end"
        )
        wait_until(
            lambda: gw.client.get("/v1/workspaces").json()[0]["protection"] == "changes",
            "the tree's protection",
        )
        env = gateway_env(tmp_path / "gw", ROOMKEEPER_WORKSPACE=str(small_fs))
        done = roomkeeper_cli(env, "reap")
        assert done.returncode == 0
        assert "keeps" in done.stdout and "untracked" in done.stdout
        assert len(gw.client.get("/v1/workspaces").json()) == 1


def test_the_cli_reap_with_an_unreadable_registry_removes_nothing(
    tmp_path: Path, small_fs: Path, repo: Path
) -> None:
    """A journal that is no database: exit 1, one line, every tree still there."""
    env = gateway_env(tmp_path, ROOMKEEPER_WORKSPACE=str(small_fs))
    tree = small_fs / "worktrees" / "kept"
    git(repo, "worktree", "add", "-q", "-b", "kept", str(tree))
    home = Path(env["ROOMKEEPER_HOME"])
    home.mkdir(mode=0o700, parents=True)
    (home / "journal.db").write_bytes(b"this is not a database" * 100)
    done = roomkeeper_cli(env, "reap")
    assert done.returncode == 1
    assert "could not be read" in done.stderr and "nothing was removed" in done.stderr
    assert tree.is_dir()


def test_batch_runs_each_line_in_its_own_tree(tmp_path: Path, small_fs: Path, repo: Path) -> None:
    """``batch --worktree``: one tree per line, registered in ROOMKEEPER_HOME's journal."""
    env = gateway_env(tmp_path, ROOMKEEPER_WORKSPACE=str(small_fs))
    done = subprocess.run(
        [sys.executable, "-m", "roomkeeper", "batch", "--worktree", str(repo)],
        input="git rev-parse --abbrev-ref HEAD\ngit rev-parse --abbrev-ref HEAD\n",
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    branches = sorted(done.stdout.split())
    assert len(set(branches)) == 2
    assert all(b.startswith("roomkeeper/batch-") for b in branches)
    journal = Journal(Path(env["ROOMKEEPER_HOME"]) / "journal.db")
    try:
        rows = journal.registered_worktrees()
        assert sorted(r.branch for r in rows) == branches
        assert {r.state for r in rows} == {"exited"}
        assert journal.protected_paths() == frozenset()
    finally:
        journal.close()


def test_batch_with_a_path_that_is_no_repository_says_so_before_any_line(tmp_path: Path) -> None:
    """One line, exit 1, nothing run."""
    env = gateway_env(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "roomkeeper", "batch", "--worktree", str(tmp_path)],
        input="touch ran\n",
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 1
    assert "is not a git repository" in done.stderr
    assert not (tmp_path / "ran").exists()


def test_run_worktree_takes_repo_and_an_optional_branch(tmp_path: Path) -> None:
    """REPO[:BRANCH]; the repository made absolute; an empty part refused."""
    os.chdir(tmp_path)
    assert parse_worktree("repo").repo == str(tmp_path / "repo")
    tree = parse_worktree("/src/app:feature/x")
    assert (tree.repo, tree.branch) == ("/src/app", "feature/x")
    with pytest.raises(UsageError, match="REPO or REPO:BRANCH"):
        parse_worktree("/src/app:")


def test_the_reap_mark_is_read_on_every_call_and_a_bad_one_falls_back() -> None:
    """ROOMKEEPER_REAP_AT_PERCENT: 80 by default, a bad value replaced by it."""
    assert read_reap_at_percent({}) == 80.0
    assert read_reap_at_percent({"ROOMKEEPER_REAP_AT_PERCENT": "70"}) == 70.0
    assert read_reap_at_percent({"ROOMKEEPER_REAP_AT_PERCENT": "170"}) == 80.0
    assert read_reap_at_percent({"ROOMKEEPER_REAP_AT_PERCENT": "lots"}) == 80.0
