"""The ``overlay`` substrate: namespaces + overlayfs over the project's Debian rootfs, O(1) fork.

- ``sandbox``: the sandboxes (one namespace holder each) and the substrate;
- ``forkserver``: the run's fork server, the deletion of discarded layers, host-side facts;
- ``namespace_init``: the fork server itself (stdlib only, run as a script), which makes holders.
"""
