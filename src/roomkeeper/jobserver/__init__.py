"""A jobserver per job, metered by memory: GNU make's token protocol, with tokens minted only
while the guard says another step fits.  Imports ``guard`` and ``kernel``.  Start with
:class:`roomkeeper.jobserver.meter.Jobservers`.

Re-exports nothing: public names live in ``roomkeeper`` itself.
"""
