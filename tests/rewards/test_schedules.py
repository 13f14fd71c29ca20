"""Weight schedules: TIRESRAG-R1's annealed a_t (spec §2.6 table) and the generic shapes."""

from __future__ import annotations

import pytest

from ragrl.errors import RagrlError
from ragrl.rewards.schedules import build_schedule, sigmoid_decay


@pytest.mark.parametrize(
    "t, expected",
    [(1, 1.000), (72, 0.997), (100, 0.951), (110, 0.877), (120, 0.723), (129.6, 0.500), (135, 0.368),
     (140, 0.261), (144, 0.192)],
)  # fmt: skip
def test_tiresrag_annealed_weight_table(t, expected):
    """a_t = 1 / (1 + exp((t − 0.9T) / 10)) at T = 144, the spec's table (three decimals)."""
    assert sigmoid_decay(t, 144, center=0.9, width=10) == pytest.approx(expected, abs=5e-4)


def test_a_schedule_is_evaluated_at_the_one_based_step_and_is_one_outside_training():
    a_t = build_schedule({"name": "sigmoid_decay", "center": 0.9, "width": 10})
    assert a_t(143, 144) == pytest.approx(0.192, abs=5e-4)  # the last step of 144 (step_count 143)
    assert a_t(0, 144) == pytest.approx(1.0, abs=5e-4)
    assert a_t(0, 0) == 1.0 and a_t(500, 0) == 1.0  # total unknown: the written weight
    ramp = build_schedule({"name": "linear", "start": 0.0, "end": 1.0})
    assert [ramp(s, 5) for s in range(5)] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert build_schedule("constant")(3, 10) == 1.0
    assert sigmoid_decay(10_000, 10) == 0.0  # no overflow far past the centre


def test_bad_schedules_are_clear_errors():
    with pytest.raises(RagrlError, match="unknown weight schedule 'cosine'"):
        build_schedule({"name": "cosine"})
    with pytest.raises(RagrlError, match="unknown parameter 'centre'; it takes \\['center', 'width'\\]"):
        build_schedule({"name": "sigmoid_decay", "centre": 0.9})
    with pytest.raises(RagrlError, match="a mapping with a 'name'"):
        build_schedule({"center": 0.9})
