"""Pressure relief, once work runs: the monitor that reads usage every interval,
the ladder that decides what the reading calls for (hold admission, suspend the
newest tree, stop it, resume), and the cooldown after a stop.  The ladder is
pure; the monitor acts through a target the scheduler provides
(:class:`roomkeeper.relief.monitor.Target`).  Imports ``guard`` and ``kernel``.
Start with :mod:`roomkeeper.relief.ladder`.

Re-exports nothing: public names live in ``roomkeeper`` itself.
"""
