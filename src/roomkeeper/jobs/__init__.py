"""Running admitted work: job specs and states, the fair queue, the scheduler and
its launch rounds, learned-size keys, and ``roomkeeper batch``.
Imports ``trees``, ``guard`` and ``kernel``.  Start with
:class:`roomkeeper.jobs.scheduler.Scheduler`.

Re-exports nothing: public names live in ``roomkeeper`` itself.
"""
