import sys

from devbridge.cli import main

sys.exit(main())
