"""jobs: see the package map in ``roomkeeper``'s docstring."""
