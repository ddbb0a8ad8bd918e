"""What the node's packages must offer, checked before Ray starts, and the pins that offer it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from trainer.config.flags import flag


@dataclass(frozen=True)
class PreflightConfig:
    """The capability names are the catalogue's (`trainer.backends.capabilities`): the argv
    layer supplies them, since the config sits below the backends."""

    TITLE = "preflight"

    require_capability: tuple[str, ...] = flag(
        (),
        nargs="+",
        metavar="NAME",
        help="capabilities the run needs beyond its backends' own (an import, a signature: "
        "sglang.Engine.load_lora_adapter_from_tensors, torch.version.hip, ...), checked with "
        "its input before Ray starts; one of a backend the run does not select is skipped",
    )
    constraints: tuple[str, ...] = flag(
        (),
        nargs="+",
        metavar="FILE",
        help="the pinned sets (pip constraints, relative to the checkout) this run's packages "
        "come from: a missing capability names the recipe's pin of its package",
    )

    def problems(self) -> Iterator[str]:
        for path in self.constraints:
            if path.startswith("/") or ".." in path.split("/"):
                yield f"--constraints {path}: give a path inside the checkout (constraints/...)"
