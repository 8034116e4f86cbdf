from drumsbench.envs.desktop import criu_fork as _criu_fork  # noqa: F401  (registers the criu fork method)
