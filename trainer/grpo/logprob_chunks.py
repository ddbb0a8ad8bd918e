"""How many rows `trainer.grpo.logprobs` turns into logits at a time (``--log-probs-chunk-size``),
without torch: the memory estimate (`trainer.job.memory_estimate`) weighs it too."""

from __future__ import annotations

# 512 rows x 151,936 vocabulary x 4 bytes = 311 MB per float32 temporary of a chunk.
DEFAULT_CHUNK_ROWS = 512


def chunk_rows_for(flag: int) -> int:
    """Rows per chunk for ``--log-probs-chunk-size`` (-1: `DEFAULT_CHUNK_ROWS`)."""
    return DEFAULT_CHUNK_ROWS if flag == -1 else flag
