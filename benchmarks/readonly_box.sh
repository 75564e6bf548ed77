#!/bin/sh
# Run a command as in a container whose cgroup file system is read-only, on a cgroup v1 host:
# in a fresh child memory group (LIMIT bytes, default 1 GiB), with /sys/fs/cgroup/memory
# remounted read-only in a private mount namespace.  roomkeeper then can make no job groups
# and arm no usage threshold, as in Docker's and Kubernetes' default layout.  Needs root.
#
#   benchmarks/readonly_box.sh .venv/bin/python benchmarks/bench_container.py --here --runs 2
set -eu
python=${PYTHON:-.venv/bin/python}
parent=$("$python" -c 'from roomkeeper.kernel.job_cgroups import job_cgroup_parent as p; print(p().directory)')
group="$parent/rk-readonly-$$"
mkdir "$group"
echo "${LIMIT:-1073741824}" > "$group/memory.limit_in_bytes"
cleanup() {
  for pid in $(cat "$group/cgroup.procs"); do kill -9 "$pid" 2>/dev/null || true; done
  sleep 1
  rmdir "$group"
}
trap cleanup EXIT
sh -c 'echo $$ > "$0/cgroup.procs"; exec unshare --mount sh -c "mount --make-rprivate / && mount -o remount,bind,ro /sys/fs/cgroup/memory && exec \"\$@\"" sh "$@"' "$group" "$@"
