"""The service inside the gateway process: scheduler, guard, leases and journal behind
one object, durable jobs and leases, recovery at start, registered calls, the chart's
samples, the supervisor link.  Start with :class:`roomkeeper.gateway.service.Gateway`.

Re-exports nothing: public names live in ``roomkeeper`` itself.
"""
