"""Git worktrees for jobs: one per job that asks, made after admission and before
its command starts, and the pruner that removes finished ones when the
workspace volume fills, never a running job's tree or anyone's unsaved work.
Imports ``guard`` and ``kernel``.  Start with
:class:`roomkeeper.worktrees.service.Worktrees`.

Re-exports nothing: public names live in ``roomkeeper`` itself.
"""
