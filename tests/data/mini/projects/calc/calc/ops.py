def add(a, b):
    """Sum of a and b."""
    return a + b


def clamp(x, lo, hi):
    """x limited to [lo, hi]."""
    return max(lo, min(x, hi))
