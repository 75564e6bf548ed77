"""The container examples in ``contrib/`` stay the README's own install command and entrypoint.

No image can be built here (no registry for base images), so what is tested is that the
Dockerfile's steps are exactly the README's first set-up command, and that the pod example
runs that image with a memory limit and ROOMKEEPER_HOME on a volume.  The behaviour inside
such a container (read-only cgroup file system, own cgroup namespace, PID 1) is tested on
the real kernel: tests/test_container_init.py, and CI's read-only cgroup v2 box.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
SERVE = " && .venv/bin/roomkeeper serve"


def readme_setup() -> str:
    """The README's first set-up command: install, then run the main job."""
    blocks = re.findall(r"```sh\n(.*?)\n```", (ROOT / "README.md").read_text(), flags=re.S)
    assert blocks, "the README opens with its set-up commands in ```sh blocks"
    return str(blocks[0]).strip()


def dockerfile() -> dict[str, list[str]]:
    """Each instruction of contrib/Dockerfile, by name, in order (comments left out)."""
    found: dict[str, list[str]] = {}
    for line in (ROOT / "contrib" / "Dockerfile").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, rest = line.partition(" ")
            found.setdefault(name, []).append(rest.strip())
    return found


def environment(steps: dict[str, list[str]]) -> dict[str, str]:
    """The image's ENV, by name."""
    return dict(pair.split("=", 1) for line in steps["ENV"] for pair in shlex.split(line))


def test_the_dockerfile_installs_with_the_readme_s_command() -> None:
    """RUN is the README's install command, word for word, then only the image's own
    tidying: apt's lists removed and the job user made; the entrypoint is its main job."""
    setup = readme_setup()
    assert setup.endswith(SERVE), setup
    install = setup.removesuffix(SERVE)
    steps = dockerfile()
    (run,) = steps["RUN"]
    assert run.startswith(install + " && "), run
    tidying = run.removeprefix(install + " && ").split(" && ")
    user = environment(steps)["ROOMKEEPER_JOB_USER"]
    assert tidying == [
        "rm -rf /var/lib/apt/lists/*",
        f"useradd --system --no-create-home --shell /usr/sbin/nologin {user}",
    ]
    apt = shlex.split(install.split(" && ")[1])
    assert apt[:4] == ["apt-get", "install", "-y", "--no-install-recommends"]
    assert "git" in apt  # jobs that ask for a worktree need it
    entry = json.loads(steps["ENTRYPOINT"][0])
    assert " ".join(entry) == SERVE.removeprefix(" && ")
    assert shlex.split(install)[-2:] == ["install", "."]  # the checkout COPY brings in
    assert steps["COPY"] == [". ."]
    assert steps["FROM"][0].startswith("debian:bookworm")  # Debian with Python 3.11


def test_the_home_is_a_volume_in_the_image_and_in_the_pod() -> None:
    """ROOMKEEPER_HOME (journal, token, history) lives on a volume, in both examples."""
    steps = dockerfile()
    home = environment(steps)["ROOMKEEPER_HOME"]
    assert steps["VOLUME"] == [home]
    pod: dict[str, Any] = yaml.safe_load((ROOT / "contrib" / "roomkeeper-pod.yaml").read_text())
    (container,) = pod["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["ROOMKEEPER_HOME"] == home
    assert [m["mountPath"] for m in container["volumeMounts"]] == [home]


def test_the_pod_has_a_memory_limit_and_probes_health_on_loopback() -> None:
    """The limit roomkeeper keeps under is set; the probe asks /health inside the container."""
    pod: dict[str, Any] = yaml.safe_load((ROOT / "contrib" / "roomkeeper-pod.yaml").read_text())
    (container,) = pod["spec"]["containers"]
    assert container["resources"]["limits"]["memory"]
    probe = " ".join(container["readinessProbe"]["exec"]["command"])
    assert "http://127.0.0.1:8765/health" in probe
