"""The SQLite journal (WAL, group commit) and one module per table; every SQL string
of the project lives here.  Imports the records it stores, never ``gateway`` or
``api``.  Start with :class:`roomkeeper.journal.database.Journal`.

Re-exports nothing: public names live in ``roomkeeper`` itself.
"""
