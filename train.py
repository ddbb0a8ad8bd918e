"""Entry of the GRPO LoRA Ray job: ``python3 train.py <argv>`` (flags: trainer/arguments.py)."""

import sys

from trainer.job.main import main

if __name__ == "__main__":
    sys.exit(main())
