from __future__ import annotations

import pytest

from trainer.backends.sglang import kv_format


@pytest.mark.parametrize(
    ("name", "model_bytes", "expected"),
    [
        (None, 2, 2.0),
        ("auto", 4, 4.0),
        ("bf16", 4, 2.0),
        ("fp8_e4m3", 2, 1.0),
        ("fp8_e5m2", 2, 1.0),
        ("mxfp8", 2, 1.03125),
        ("nvfp4", 2, 0.5625),
    ],
)
def test_element_bytes_follow_the_format_else_the_model_s_dtype(name, model_bytes, expected):
    assert kv_format.element_bytes(name, model_bytes) == expected


def test_an_unknown_format_is_one_line_naming_the_known_ones():
    assert kv_format.problem("fp8_e4m3") is None
    assert kv_format.problem(None) is None
    message = kv_format.problem("int8")
    assert message is not None and "\n" not in message
    assert message.startswith("--sglang-kv-cache-dtype int8: not a KV-cache format of SGLang")
    assert "fp8_e4m3" in message
    with pytest.raises(kv_format.KVFormatError, match="int8"):
        kv_format.element_bytes("int8", 2)
