import sys

from pyterrier_rdime.experiment.cli import main

sys.exit(main())
