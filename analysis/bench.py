"""`python -m analysis.bench COMMAND ...`, the benchmarks' name in docs/science.md section 8: they live in
bench/ (`python -m bench`, `leaner-bench`); this keeps that public name working."""

import sys

from bench.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
