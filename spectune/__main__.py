import sys

from spectune.cli import main

sys.exit(main())
