"""The gRPC services the cloud serves itself (tasks, progress, fleet, decision log, the
planner's wiring); who may call them is `cloud.authz`."""
