"""``python -m roomkeeper``: the same as the ``roomkeeper`` command."""

from roomkeeper.cli.app import main

main()
