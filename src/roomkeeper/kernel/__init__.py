"""What the kernel says, read fresh: parsers of kernel text, our own cgroup and its
levels, resource readings, job cgroups.  Imports only the basics.  Start with
:func:`roomkeeper.kernel.resources.read_resources`.

Re-exports nothing: public names live in ``roomkeeper`` itself.
"""
