"""The judge0 section's batch is the class the issue describes."""

from collections import Counter

from sandpod_bench.sections.judge0 import (
    ACCEPTED,
    BATCH_SIZE,
    COMPILATION_ERROR,
    TIME_LIMIT,
    WRONG_ANSWER,
    class_batch,
)


def test_the_batch_has_every_verdict_kind_in_the_issues_numbers() -> None:
    batch = class_batch()
    assert len(batch) == BATCH_SIZE == 100
    assert Counter(verdict for _, verdict in batch) == {
        ACCEPTED: 65,
        WRONG_ANSWER: 20,
        TIME_LIMIT: 10,
        COMPILATION_ERROR: 5,
    }
    # Interleaved as a class sends them: no kind comes all at the end.
    assert {verdict for _, verdict in batch[:50]} == {verdict for _, verdict in batch}
