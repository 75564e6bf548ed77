"""``roomkeeper serve``: runs the gateway as its child and watches it from outside,
through :mod:`roomkeeper.ipc` only (it never imports the gateway).  Start with
:mod:`roomkeeper.supervisor.service`.

Re-exports nothing: public names live in ``roomkeeper`` itself.
"""
