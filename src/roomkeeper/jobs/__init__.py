"""Running admitted work: job specs and states, the fair queue, the scheduler and its
launch rounds, managed process trees (their sampled peaks, their suspension, their
orphans), the lifeline, and ``roomkeeper batch``.
Imports ``guard`` and ``kernel``.  Start with :class:`roomkeeper.jobs.scheduler.Scheduler`.

Re-exports nothing: public names live in ``roomkeeper`` itself.
"""
