"""The ``roomkeeper`` command: the click group (:mod:`roomkeeper.cli.app`) and its command
groups (``local``: no gateway; ``remote``: requests to one; ``service``: running it).

Re-exports nothing: public names live in ``roomkeeper`` itself.
"""
