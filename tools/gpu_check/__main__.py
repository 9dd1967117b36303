"""`python -m tools.gpu_check`: runs tools/gpu_check/run.py."""
import sys

from tools.gpu_check.run import main

sys.exit(main())
