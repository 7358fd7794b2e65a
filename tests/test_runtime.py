"""The shared option parsing of rltbench.options and rltbench.runtime: what e2e and pd read from
--concurrency and from the model flags means the same in both, and bad values are one UsageError before
any work."""

from __future__ import annotations

import pytest

from rltbench import options, runtime
from rltbench.errors import UsageError


def test_concurrency_keeps_the_order_and_drops_repeats() -> None:
    assert options.parse_concurrency(" 8,1, 8,32 ") == [8, 1, 32]


@pytest.mark.parametrize(
    "text, needle", [("1,x", "not an integer"), ("4,0", "must be >= 1"), (" , ", "empty"),
                     ("1,,8", "an empty item")]
)
def test_bad_concurrency_is_a_usage_error(text: str, needle: str) -> None:
    with pytest.raises(UsageError, match=needle):
        options.parse_concurrency(text)


def test_kv_layout_overrides_a_huginn_config_and_is_refused_elsewhere() -> None:
    source = runtime.ModelSource("huginn-tiny", kv_layout="compress")
    assert source.config().kv_layout == "compress" and source.overrides == {"kv_layout": "compress"}
    assert runtime.ModelSource("huginn-tiny").overrides == {}
    with pytest.raises(UsageError, match="Huginn option"):
        runtime.ModelSource("ouro-tiny", kv_layout="full").config()
