import sys

from devbridge.cli.main import main

sys.exit(main())
