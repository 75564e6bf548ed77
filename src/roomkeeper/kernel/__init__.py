"""What the kernel says, read fresh: parsers of kernel text, our own cgroup and its
levels, resource readings, job cgroups and where cgroup v2 lets us make them, and
the freezer's three ways to suspend a tree.  Imports only the basics.  Start with
:func:`roomkeeper.kernel.resources.read_resources`.

Re-exports nothing: public names live in ``roomkeeper`` itself.
"""
