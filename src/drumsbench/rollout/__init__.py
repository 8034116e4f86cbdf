"""One attempt, gate by gate (attempt.py), the gates (gates.py), isolation canaries (isolation.py)
and fault injection (faults.py)."""
