"""Where CRIU is: the locator lives in ``drumsbench.core.criu_binary`` (the desktop environment's
reset by restore needs it below this layer); this name stays for its importers."""

from drumsbench.core.criu_binary import DEFAULT_HOME, MIN_MAJOR, criu_path, describe, missing, version

__all__ = ["DEFAULT_HOME", "MIN_MAJOR", "criu_path", "describe", "missing", "version"]
