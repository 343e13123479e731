"""Distributions of clustering tasks (docs/science.md section 1): tasks.spec says what one is,
tasks.families holds one record per family, tasks.sampler draws its tasks and their initial centers."""
