"""The operator-facing gRPC services (tasks, progress, fleet, decision log) and their auth."""
