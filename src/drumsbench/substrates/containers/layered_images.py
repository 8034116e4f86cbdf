"""Task images for substrates that are not container engines: built by one, run from its layer folders.

``overlay`` and ``bwrap`` are ``RecipeImages`` without an image store of their own. A
``LayeredImages`` builds a task's image with a container engine (docker where it answers, else
podman: ``builder``), reads where that engine keeps the image's layers (``image_layout``) and
hands the substrate those folders to mount as the lower layers of each sandbox's root — no export,
no copy. The engine is made once per run (under a lock: two threads building at once share it) and
closed with the substrate (``close``).

Refused with ``SubstrateError`` in one line: an image whose ``USER`` is not root (both substrates run
every command as uid 0 of the sandbox), and an engine whose storage driver keeps no overlay layers.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING

from drumsbench.core.errors import SubstrateError
from drumsbench.substrates.base import ImageRecipe
from drumsbench.substrates.containers.image_layout import is_root_user

if TYPE_CHECKING:  # the container stack is imported when a task image is first built
    from drumsbench.substrates.containers.common import ContainerSubstrate
    from drumsbench.substrates.containers.image_layout import ImageLayout

ENGINES = ("docker", "podman")


class LayeredImages:
    """Images of one run of substrate ``owner`` (its name, for messages), by reference
    (``engine:image-id``, what ``build`` returns and ``layout`` takes)."""

    def __init__(self, owner: str, run_id: str, state_dir: Path) -> None:
        self.owner = owner
        self.run_id = run_id
        self.state_dir = state_dir
        self._builder: ContainerSubstrate | None = None
        self._builder_lock = threading.Lock()  # held while the builder is made: one engine per run
        self._lock = threading.Lock()
        self._layouts: dict[str, ImageLayout] = {}

    def builder(self) -> ContainerSubstrate:
        """The container engine that builds this run's task images: docker where it answers, else
        podman (made once; ``SubstrateError`` naming why neither can be used)."""
        with self._builder_lock:
            if self._builder is not None:
                return self._builder
            from drumsbench.substrates import registry
            from drumsbench.substrates.containers.common import ContainerSubstrate

            why = []
            for engine in ENGINES:
                cls = registry.get(engine)
                if (reason := cls.missing()) is not None:
                    why.append(f"{engine}: {reason}")
                    continue
                builder = cls(f"{self.run_id}-images", self.state_dir)
                assert isinstance(builder, ContainerSubstrate)
                self._builder = builder
                return builder
        raise SubstrateError(f"{self.owner}: task images are built by docker or podman, and neither is here (" +
                             "; ".join(why) + ")")

    def build(self, recipe: ImageRecipe) -> str:
        """Build ``recipe`` (cached by the engine) and learn its layout; returns its reference.
        ``SubstrateError`` for a non-root ``USER`` or layers the engine keeps in another format."""
        builder = self.builder()
        image = builder.build_recipe(recipe)
        ref = f"{builder.name}:{image}"
        with self._lock:
            if ref in self._layouts:
                return ref
        layout = builder.image_layout(image)
        if not is_root_user(layout.user):
            raise SubstrateError(f"{self.owner}: image {image} runs as USER {layout.user}; the {self.owner} substrate "
                                 "runs commands as root only (use docker or podman)")
        with self._lock:
            self._layouts[ref] = layout
        return ref

    def layout(self, ref: str) -> ImageLayout:
        """The layout of an image ``build`` returned; ``SubstrateError`` for any other reference."""
        with self._lock:
            layout = self._layouts.get(ref)
        if layout is None:
            raise SubstrateError(f"{self.owner}: no image {ref} (build_recipe makes a task's image)")
        return layout

    def known(self, ref: str) -> ImageLayout | None:
        """``layout`` or ``None``."""
        with self._lock:
            return self._layouts.get(ref)

    def close(self) -> None:
        """Close the builder (its run's containers; the images stay in the engine's cache)."""
        with self._builder_lock:
            builder, self._builder = self._builder, None
        if builder is not None:
            builder.close()
