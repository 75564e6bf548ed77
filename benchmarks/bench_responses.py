"""What the success models cost a big answer: ``GET /v1/jobs`` at its largest.

A list answers at most 500 journal rows plus the scheduler's 1,000 kept jobs.
Each route now checks its view's dicts against its model and dumps them
(``response_model`` with ``exclude_unset``); before, FastAPI ran its
``jsonable_encoder`` over the untyped dicts.  Both are timed here on the same
1,500 job dicts, in process, best of several rounds.

Run: ``.venv/bin/python benchmarks/bench_responses.py``
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fastapi.encoders import jsonable_encoder
from pydantic import TypeAdapter

from roomkeeper.api.responses import JobOut

JOBS = 1500
ROUNDS = 20


def job(n: int) -> dict[str, Any]:
    """A job as ``views.job_json`` or ``row_json`` builds it (every third from the journal)."""
    answer: dict[str, Any] = {
        "id": f"{n:012x}",
        "owner": f"owner-{n % 7}",
        "state": "exited",
        "reason": None,
        "exit_code": 0,
        "argv": ["python", "-m", "pytest", f"tests/test_{n}.py"],
        "submitted_at": 1_764_000_000.0 + n,
        "started_at": 1_764_000_000.5 + n,
        "ended_at": 1_764_000_003.0 + n,
        "peak_bytes": 50_000_000 + n,
        "error": None,
    }
    if n % 3 == 0:
        answer["resolution"] = None
    return answer


def best_ms(run: Callable[[], object]) -> float:
    """The fastest of :data:`ROUNDS` runs, in milliseconds."""
    times = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times) * 1000


def main() -> None:
    jobs = [job(n) for n in range(JOBS)]
    adapter = TypeAdapter(list[JobOut])

    def with_model() -> object:
        return adapter.dump_python(adapter.validate_python(jobs), mode="json", exclude_unset=True)

    assert with_model() == jobs  # the wire keeps the views' keys, value for value
    model = best_ms(with_model)
    untyped = best_ms(lambda: jsonable_encoder(jobs))
    print(f"{JOBS} jobs, best of {ROUNDS}:")
    for name, ms in (("response model (validate + dump)", model), ("jsonable_encoder", untyped)):
        print(f"  {name:33} {ms:7.2f} ms  ({ms / JOBS * 1e3:.1f} us/job)")


if __name__ == "__main__":
    main()
