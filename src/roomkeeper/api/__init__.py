"""api: see the package map in ``roomkeeper``'s docstring."""
