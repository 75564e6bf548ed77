"""Running admitted work: job specs and states, the fair queue, the scheduler and
its launch rounds, the scheduler's side of the relief ladder, learned-size keys.
Imports ``worktrees``, ``processes``, ``relief``, ``guard`` and ``kernel``.  Start with
:class:`roomkeeper.jobs.scheduler.Scheduler`.

Re-exports nothing: public names live in ``roomkeeper`` itself.
"""
