import sys

from analysis.seeds import main

sys.exit(main())
