import sys

from pyterrier_rdime.cli import main

sys.exit(main())
