import sys

from analysis.claims import main

sys.exit(main())
