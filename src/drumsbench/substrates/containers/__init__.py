"""The container substrates: ``common`` (the image, scripts and sandbox logic both share),
``docker`` (the Docker daemon through its SDK) and ``podman`` (the podman CLI)."""
