"""DrumsBench: run and judge RL rollout infrastructure."""

__version__ = "0.1.0"
