"""Does one more fit: the admission rule and its reservations, leases for work run
elsewhere.  Imports ``loopback`` and ``kernel``.  Start with
:class:`roomkeeper.guard.admission.Guard`.

Re-exports nothing: public names live in ``roomkeeper`` itself.
"""
