"""The operators' surfaces: the FastAPI console gateway and the `amc` command line."""
