"""What operators see of a running server: Prometheus metrics (`metrics`), OpenTelemetry traces (`tracing`),
the engine clock's cheap per-tick figures (`timing`) and the per-call glue that feeds them (`observer`).

Submodules are imported where used, so that the engine thread's `timing` never pulls in Prometheus or
OpenTelemetry.
"""
