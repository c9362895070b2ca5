"""What every amc process shares to be run like a service: log context and formats (`logs`),
trace setup and gRPC trace propagation (`tracing`), and the `/metrics` HTTP endpoint
(`metrics_http`). It imports none of amc's other packages: the cloud, the host and the planner
all use it, each keeping its own metric definitions (`cloud/metrics.py`, `host/metrics.py`)."""
