import pytest
from stats import median


@pytest.mark.parametrize(("values", "want"), [([3], 3), ([1, 9, 5], 5), ([4, 1], 2.5), ([7, 1, 3, 5], 4.0)])
def test_median(values, want):
    assert median(values) == want


def test_input_unchanged():
    values = [5, 1, 3, 2]
    median(values)
    assert values == [5, 1, 3, 2]
