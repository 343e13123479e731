"""Clustering transformers, Lloyd's algorithm and the losses (docs/science.md sections 2-4)."""
