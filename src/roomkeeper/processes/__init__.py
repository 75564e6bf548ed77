"""Managed process trees: launching one (its own session, lowered priority,
output in files, its own memory group where one can be made), watching it
(sampled peaks, readiness), suspending and stopping the whole tree, adopting
its orphans, and the lifeline that kills every tree if the scheduler dies.
Imports ``kernel``.  Start with :func:`roomkeeper.processes.launch.launch`.

Re-exports nothing: public names live in ``roomkeeper`` itself.
"""
