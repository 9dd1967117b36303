"""`python -m online.gpu_check`: runs online/gpu_check/run.py."""
import sys

from online.gpu_check.run import main

sys.exit(main())
