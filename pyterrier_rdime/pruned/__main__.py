"""``python -m pyterrier_rdime.pruned [--threads N]``: :func:`.calibration.main`."""
from .calibration import main

if __name__ == '__main__':
    raise SystemExit(main())
