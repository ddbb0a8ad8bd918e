"""The job's secret variables, from a file only its user can read, not from Ray's runtime env.

Ray writes a job's runtime env, variables and values, in clear text into its logs
(``runtime_env_agent.log``: ``Creating runtime env: {"env_vars": {...}}``). So a launcher that
starts its own Ray puts the job's secrets (``WANDB_API_KEY``, ``HF_TOKEN``, ``--extra-env``
secrets) as a JSON object into a file of mode 0600 in the run's private dir, and only the file's
path into the runtime env (`ENV_FILE_VAR`). `load` adds them to ``os.environ``: ``train.py``
calls it before anything else, and Ray calls it in every worker process of the job (the runtime
env's ``worker_process_setup_hook``, `SETUP_HOOK`). Standard library only: a worker may run
another interpreter.
"""

from __future__ import annotations

import json
import os

ENV_FILE_VAR = "GRPO_JOB_ENV_FILE"
SETUP_HOOK = "trainer.job_env.load"


class JobEnvError(Exception):
    """The file the job's environment names cannot be read as variables (one line)."""


def load() -> None:
    """Add the variables of the file `ENV_FILE_VAR` names (if it names one) to os.environ."""
    path = os.environ.get(ENV_FILE_VAR)
    if not path:
        return
    try:
        with open(path) as file:
            variables = json.load(file)
    except OSError as err:
        raise JobEnvError(f"{ENV_FILE_VAR}={path}: {err.strerror or err}") from None
    except ValueError:
        raise JobEnvError(f"{ENV_FILE_VAR}={path}: not a JSON object of variables") from None
    if not isinstance(variables, dict) or not all(
        isinstance(name, str) and isinstance(value, str) for name, value in variables.items()
    ):
        raise JobEnvError(f"{ENV_FILE_VAR}={path}: not a JSON object of variables")
    os.environ.update(variables)
