"""The ``vm`` substrate: each sandbox is a QEMU virtual machine forked from a booted snapshot.

- ``image``: the guest (kernel, initramfs, disk) and its build; ``agent.c``: the guest's init;
- ``qemu``: host facts (QEMU version, accelerator), the QEMU command line and process, its monitor;
- ``agent``: the JSON-lines channel to the guest agent;
- ``snapshot``: the booted snapshot, forks of a snapshot, live snapshots of a running VM;
- ``sandbox``: the sandboxes and the substrate.
"""
