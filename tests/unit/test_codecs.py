"""The value formats the scripts write, read back in one place (``tether.protocol._codecs``)."""

from __future__ import annotations

from tether.protocol._codecs import (
    DEFAULT_SIDX,
    index_value,
    locate,
    parse_entry_name,
    parse_index_value,
    parse_scheduled,
)


def test_an_index_value_round_trips_and_a_foreign_one_is_refused() -> None:
    assert parse_index_value(index_value(3, "1732870000000-7")) == (3, "1732870000000-7")
    assert parse_index_value(memoryview(b"11-0")) == (1, "1-0")
    for foreign in (b"", b"41-0", b"21-0-0", b"2abc", b"x" * 1000):
        assert parse_index_value(foreign) is None, foreign
    assert parse_index_value(None) is None


def test_a_task_is_located_by_its_index_value_else_by_its_derived_id() -> None:
    assert locate("default:9f2c" + "0" * 28, b"21-5") == (2, "1-5")
    assert locate("default:3-1732870000000-0", None) == (3, "1732870000000-0")
    assert locate("default:9f2c" + "0" * 28, None) is None


def test_a_scheduled_payload_names_its_stream_and_an_unreadable_head_reads_as_normal() -> None:
    assert parse_scheduled(b'1{"v":1}') == (1, b'{"v":1}')
    assert parse_scheduled(bytearray(b'3{"v":1}')) == (3, b'{"v":1}')
    assert parse_scheduled(b'9{"v":1}') == (DEFAULT_SIDX, b'{"v":1}')


def test_an_entry_name_splits_into_its_stream_and_id() -> None:
    assert parse_entry_name(b"21732870000000-0") == (2, b"1732870000000-0")
    assert parse_entry_name(b"") == (0, b"")
