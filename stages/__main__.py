import sys

from stages.cli import main

sys.exit(main())
