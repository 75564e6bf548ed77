"""HTTP on loopback: the FastAPI app, one module per resource's routes, request models,
JSON views, the Health page, metrics, serving.  The only package that imports FastAPI
or Starlette.  Start with :func:`roomkeeper.api.app.create_app`.

Re-exports nothing: public names live in ``roomkeeper`` itself.
"""
