"""The short texts the model benches embed (bench/infer.py, bench/gpu.py): standard
library only, so bench/gpu.py can take them to a machine that has none of Kestrel's
dependencies."""

from __future__ import annotations

SUBJECTS = ["A man", "The girl", "A chef", "Two dogs", "An old woman", "The pilot", "A child",
            "The team"]
VERBS = ["is eating", "is carrying", "is painting", "watches", "is repairing", "buys",
         "is reading about", "photographs"]
OBJECTS = ["a piece of bread", "a baby", "the fence", "the sunset over the harbour",
           "a bicycle", "fresh vegetables", "the history of trains", "a red kite"]


def sentences(n: int, offset: int = 0) -> list[str]:
    """Short texts (9-14 word pieces), all different."""
    return [f"{SUBJECTS[i % 8]} {VERBS[(i // 8) % 8]} {OBJECTS[(i // 64) % 8]} on day {i}."
            for i in range(offset, offset + n)]
