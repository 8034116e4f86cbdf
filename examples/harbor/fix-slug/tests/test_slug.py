import pytest
from slug import slug


@pytest.mark.parametrize(("title", "want"), [
    ("Hello World", "hello-world"),
    ("  Many   spaces  ", "many-spaces"),
    ("C++ & Rust!", "c-rust"),
    ("already-a-slug", "already-a-slug"),
])
def test_slug(title, want):
    assert slug(title) == want
