import sys

from kvcy.cli import main

sys.exit(main())
