"""Distributions of clustering tasks (docs/science.md section 1): tasks.spec says what one is,
tasks.sampler draws its tasks, tasks.init their initial centers."""
