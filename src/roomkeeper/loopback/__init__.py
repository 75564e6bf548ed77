"""Calls made out on loopback: the release hook a lease or job carries for when it
ends, and the relieve hook the ladder may call to ask a lease for memory back.
Imports nothing else of ours.  Start with
:class:`roomkeeper.loopback.hook_calls.HookRunner`.

Re-exports nothing: public names live in ``roomkeeper`` itself.
"""
