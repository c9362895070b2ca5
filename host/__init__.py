"""The host agent: device drivers, perception, the agent loop, the timeline and the lease client."""
