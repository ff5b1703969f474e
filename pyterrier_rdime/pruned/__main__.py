"""``python -m pyterrier_rdime.pruned [--threads N]``: :func:`.calibration.main`."""
import sys

from .calibration import main

if __name__ == '__main__':
    sys.exit(main())
