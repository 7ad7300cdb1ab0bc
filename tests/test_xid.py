"""The xid value: exact encoding, size limits at the extremes, and ownership decided by strict parsing."""

from __future__ import annotations

import pytest

from xasink.protocol.xid import FORMAT_ID, MAX_BATCH_ID, Xid, attempt_token, new_log_id, new_run_nonce, valid_sink_id

SINK32 = "S" * 16 + "a_.-" * 4  # 32 characters, every allowed kind
MAX_PARTITION = 9_999_999_999
MAX_TASK_ATTEMPT = 9_999_999_999_999_999_999  # 19 digits
LOG = "0123456789"
GOOD = "xasink:orders:7/0123456789:3:42-0a1b2c3d"


def test_gid_layout_and_round_trip() -> None:
    xid = Xid(LOG, "orders", 7, 3, "42-0a1b2c3d")
    assert xid.gtrid == "xasink:orders:7"
    assert xid.bqual == "0123456789:3:42-0a1b2c3d"
    assert xid.log_id == LOG
    assert xid.gid == str(xid) == GOOD
    assert xid.task_attempt_id == 42
    assert xid.run == "0a1b2c3d"
    assert Xid.parse(xid.gid) == xid


def test_from_xa_round_trip() -> None:
    xid = Xid(LOG, "orders", 7, 3, "42-0a1b2c3d")
    assert Xid.from_xa(FORMAT_ID, xid.gtrid.encode(), xid.bqual.encode()) == xid
    assert Xid.from_xa(FORMAT_ID + 1, xid.gtrid.encode(), xid.bqual.encode()) is None
    assert Xid.from_xa(1, xid.gtrid.encode(), xid.bqual.encode()) is None  # MySQL's default formatID
    assert Xid.from_xa(FORMAT_ID, b"xasink:orders:7\xff", xid.bqual.encode()) is None
    assert Xid.from_xa(FORMAT_ID, xid.gtrid.encode(), b"") is None
    assert Xid.from_xa(FORMAT_ID, xid.gtrid.encode() + b"/", xid.bqual.encode()) is None


@pytest.mark.parametrize(
    ("sink", "batch", "partition", "task_attempt"),
    [
        (SINK32, MAX_BATCH_ID, MAX_PARTITION, MAX_TASK_ATTEMPT),
        ("a", 0, 0, 0),
        (SINK32, 0, MAX_PARTITION, 0),
        ("x", MAX_BATCH_ID, 0, MAX_TASK_ATTEMPT),
    ],
)
def test_extremes_fit_and_round_trip(sink: str, batch: int, partition: int, task_attempt: int) -> None:
    xid = Xid(LOG, sink, batch, partition, attempt_token(task_attempt, "ffffffff"))
    assert len(xid.gtrid.encode()) <= 64  # MySQL's limit per part
    assert len(xid.bqual.encode()) <= 64
    assert len(xid.gid.encode()) < 200  # PostgreSQL's gid limit
    assert xid.gid.isascii()
    assert Xid.parse(xid.gid) == xid
    assert Xid.from_xa(FORMAT_ID, xid.gtrid.encode(), xid.bqual.encode()) == xid
    assert xid.task_attempt_id == task_attempt


def test_order_and_hash() -> None:
    a = Xid(LOG, "s", 1, 0, "1-00000000")
    b = Xid(LOG, "s", 1, 1, "1-00000000")
    assert sorted([b, a]) == [a, b]
    assert {a, Xid.parse(a.gid)} == {a}


def test_run_nonce() -> None:
    nonces = {new_run_nonce() for _ in range(50)}
    assert len(nonces) == 50
    for n in nonces:
        assert len(n) == 8 and all(c in "0123456789abcdef" for c in n)
        assert Xid(LOG, "s", 0, 0, attempt_token(5, n)).run == n


@pytest.mark.parametrize(
    "gid",
    [
        "",
        "xasink",
        "xasink:",
        GOOD + "x",
        GOOD + "/",
        GOOD + "\n",
        "\n" + GOOD,
        " " + GOOD,
        GOOD + " ",
        "XASINK:orders:7/3:42-0a1b2c3d",
        "Xasink:orders:7/3:42-0a1b2c3d",
        "xasink-orders:7/3:42-0a1b2c3d",
        "xasink:orders/7/3:42-0a1b2c3d",
        "xasink:orders:7:3:42-0a1b2c3d",
        "xasink:orders:7/3/42-0a1b2c3d",
        "xasink:orders:7/3:42_0a1b2c3d",
        "xasink:orders:7/3:42-0A1B2C3D",  # nonce is lower-case hex
        "xasink:orders:7/3:42-0a1b2c3",  # short nonce
        "xasink:orders:7/3:42-0a1b2c3d4",  # long nonce
        "xasink:orders:7/3:42-zzzzzzzz",
        "xasink:orders:7/3:-0a1b2c3d",
        "xasink:orders:7/3:42-",
        "xasink:orders:7/3:",
        "xasink:orders:7/:42-0a1b2c3d",
        "xasink:orders:/3:42-0a1b2c3d",
        "xasink::7/3:42-0a1b2c3d",
        "xasink:orders:07/3:42-0a1b2c3d",  # leading zeros would give two gids for one batch
        "xasink:orders:7/03:42-0a1b2c3d",
        "xasink:orders:-7/3:42-0a1b2c3d",
        "xasink:orders:+7/3:42-0a1b2c3d",
        "xasink:orders:7/-3:42-0a1b2c3d",
        "xasink:ordérs:7/3:42-0a1b2c3d",
        "xasink:orders:７/3:42-0a1b2c3d",  # full-width digit
        "xasink:orders:7/3:٤٢-0a1b2c3d",  # Arabic-Indic digits
        "xasink:'orders':7/3:42-0a1b2c3d",
        'xasink:"orders":7/3:42-0a1b2c3d',
        "xasink:ord ers:7/3:42-0a1b2c3d",
        "xasink:ord/ers:7/3:42-0a1b2c3d",
        "xasink:ord:ers:7/3:42-0a1b2c3d",
        "xasink:" + "a" * 33 + ":7/3:42-0a1b2c3d",
        "xasink:orders:7/3:42-0a1b2c3d\x00",
        "xasink:orders:9223372036854775808/3:42-0a1b2c3d",  # 2**63: out of range
        "xasink:orders:9999999999999999999/3:42-0a1b2c3d",
        "xasink:orders:7/10000000000:42-0a1b2c3d",  # 11-digit partition
        "xasink:orders:7/3:12345678901234567890-0a1b2c3d",  # 20-digit task attempt
        "foreign-1",
        "xasink:bad",
        "xasink:s:1/0:1-zzzzzzzz",
    ],
)
def test_near_misses_are_foreign(gid: str) -> None:
    assert Xid.parse(gid) is None


def test_near_miss_xa_parts_are_foreign() -> None:
    assert Xid.from_xa(FORMAT_ID, b"xasink:orders:9223372036854775808", b"3:42-0a1b2c3d") is None
    assert Xid.from_xa(FORMAT_ID, b"xasink:orders:7", b"3:42-0a1b2c3d/x") is None
    assert Xid.from_xa(FORMAT_ID, b"xasink:orders:7/3", b"42-0a1b2c3d") is None


@pytest.mark.parametrize(
    "sink",
    [
        "",
        "a" * 33,
        "a b",
        "a:b",
        "a/b",
        "a'b",
        'a"b',
        "a;b",
        "a\nb",
        "a\x00b",
        "ordérs",
        "таблица",
        "a\\b",
        "a%b",
        "x'; ROLLBACK PREPARED 'foreign-1",
    ],
)
def test_hostile_sink_ids_rejected(sink: str) -> None:
    assert not valid_sink_id(sink)
    with pytest.raises(ValueError, match="sink id"):
        Xid(LOG, sink, 0, 0, "1-00000000")


@pytest.mark.parametrize(
    ("batch", "partition", "attempt"),
    [
        (-1, 0, "1-00000000"),
        (MAX_BATCH_ID + 1, 0, "1-00000000"),
        (0, -1, "1-00000000"),
        (0, 10**10, "1-00000000"),
        (0, 0, "1-0000000"),
        (0, 0, "1-0000000G"),
        (0, 0, "-00000000"),
        (0, 0, "12345678901234567890-00000000"),
        (0, 0, "1-00000000\n"),
    ],
)
def test_out_of_range_parts_rejected(batch: int, partition: int, attempt: str) -> None:
    with pytest.raises(ValueError):
        Xid(LOG, "s", batch, partition, attempt)


def test_log_id_is_part_of_the_identity() -> None:
    """Two decision logs on one server never take each other's branches for their own (issue 15, item 4)."""
    a = Xid(LOG, "orders", 7, 3, "42-0a1b2c3d")
    b = Xid("abcdef0123", "orders", 7, 3, "42-0a1b2c3d")
    assert a != b and a.gtrid == b.gtrid and a.bqual != b.bqual
    assert Xid.parse(b.gid) == b and Xid.parse(b.gid).log_id == "abcdef0123"  # type: ignore[union-attr]
    # the format before log ids no longer parses: never touched as ours
    assert Xid.parse("xasink:orders:7/3:42-0a1b2c3d") is None
    ids = {new_log_id() for _ in range(50)}
    assert len(ids) == 50 and all(len(i) == 10 and int(i, 16) >= 0 for i in ids)


@pytest.mark.parametrize("log_id", ["", "012345678", "01234567890", "012345678G", "ABCDEF0123", "01234-6789"])
def test_malformed_log_ids_rejected(log_id: str) -> None:
    with pytest.raises(ValueError, match="log id"):
        Xid(log_id, "s", 0, 0, "1-00000000")
