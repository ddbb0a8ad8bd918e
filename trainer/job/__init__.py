"""The Ray job: its entry (`trainer.job.main`), the preflight, the placement of trainers and
rollout engines as Ray actors, and the memory planning behind ``--colocate-memory auto``."""
