"""``roomkeeper batch``, the application: a memory-aware ``parallel`` built on the
scheduler, run without a server.  What it shows a person (the progress bar,
the summary table) lives in ``cli``.  Imports ``jobs``, ``worktrees``,
``processes``, ``relief``, ``guard`` and ``kernel``.  Start with
:func:`roomkeeper.batch.run.run_batch`.

Re-exports nothing: public names live in ``roomkeeper`` itself.
"""
