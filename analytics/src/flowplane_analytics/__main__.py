"""`python -m flowplane_analytics …`, and the file spark-submit runs on a cluster."""

import sys

from flowplane_analytics.cli import main

if __name__ == "__main__":
    sys.exit(main())
