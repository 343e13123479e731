"""Clustering transformers, Lloyd's algorithm and the losses (SPEC sections 2-4)."""
