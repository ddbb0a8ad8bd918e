"""A run's files and inputs: prompt data and context lengths, checkpoints and the checks before
one resumes, metrics and their plot, trainer states as data, and a saved adapter's own proof."""
