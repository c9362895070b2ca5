"""Learned flows on the cloud: embeddings, retrieval at assignment, the learning loop."""
