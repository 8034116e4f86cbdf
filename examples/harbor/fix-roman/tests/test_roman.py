import pytest
from roman import to_roman


@pytest.mark.parametrize(("n", "want"), [
    (1, "I"), (4, "IV"), (9, "IX"), (14, "XIV"), (40, "XL"), (90, "XC"), (400, "CD"), (944, "CMXLIV"),
    (1994, "MCMXCIV"), (2024, "MMXXIV"), (3999, "MMMCMXCIX"),
])
def test_to_roman(n, want):
    assert to_roman(n) == want
