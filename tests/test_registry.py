import pytest

from ragrl.errors import RagrlError
from ragrl.registry import Registry


def test_register_get_and_errors_that_name_the_kind():
    reg: Registry = Registry("widget")

    @reg.register("b")
    def b():
        return 2

    reg.register("a")(lambda: 1)
    assert reg.get("b") is b and reg["b"]() == 2
    assert reg.names() == ["a", "b"] and "a" in reg and len(reg) == 2
    assert reg.register("b")(b) is b  # re-registering the same function is harmless
    with pytest.raises(RagrlError, match=r"widget 'b' is already registered"):
        reg.register("b")(lambda: 3)
    with pytest.raises(RagrlError, match=r"unknown widget 'c'; registered: a, b"):
        reg.get("c")
