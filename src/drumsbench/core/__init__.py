"""The lowest layer: outcomes, records, errors, fingerprints, canary scans, the verdict channel,
the plugin registry, the host's state folder and machine facts. It imports nothing above it."""
