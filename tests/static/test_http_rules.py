"""The pure HTTP rules in ``aiosendfile._static._http``: tables for each rule, properties against
reference models."""

from __future__ import annotations

import email.message
import email.parser
import email.policy
import itertools
import re
import time
from collections.abc import Mapping

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict, CIMultiDictProxy

from aiosendfile._static._http import (
    ByteRange,
    InvalidRange,
    RangeNotSatisfiable,
    choose_encoding,
    evaluate_preconditions,
    file_headers,
    http_date,
    if_range_allows,
    make_etag,
    multipart_byteranges,
    parse_etag_list,
    parse_http_date,
    parse_ranges,
)

from ..support.files import pattern
from ..support.raw_http import parse_multipart

# The autouse conftest fixtures are function-scoped but harmless to share between examples.
PROPERTY = settings(
    deadline=None, max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
QUICK_PROPERTY = settings(PROPERTY, max_examples=60)

NOT_SATISFIABLE = "416"  # valid, but nothing in the file
INVALID = "416 invalid"  # against the grammar

# -- ByteRange ------------------------------------------------------------------------


def test_byte_range_length_and_content_range() -> None:
    r = ByteRange(0, 100)
    assert r.length == 100
    assert r.content_range(1000) == "bytes 0-99/1000"
    assert ByteRange(999, 1000).content_range(1000) == "bytes 999-999/1000"


@pytest.mark.parametrize(("start", "stop"), [(5, 5), (6, 5), (-1, 3)])
def test_byte_range_rejects_empty_or_negative(start: int, stop: int) -> None:
    with pytest.raises(ValueError, match="byte range"):
        ByteRange(start, stop)


# -- parse_ranges: table -----------------------------------------------------------

RANGE_CASES: list[tuple[str | None, int, object]] = [
    # single ranges: a-b (clamped), a-, -n
    ("bytes=0-499", 1000, [(0, 500)]),
    ("bytes=500-999", 1000, [(500, 1000)]),
    ("bytes=0-0", 1000, [(0, 1)]),
    ("bytes=999-999", 1000, [(999, 1000)]),
    ("bytes=900-5000", 1000, [(900, 1000)]),
    ("bytes=500-", 1000, [(500, 1000)]),
    ("bytes=0-", 1000, [(0, 1000)]),
    ("bytes=-500", 1000, [(500, 1000)]),
    ("bytes=-1", 1000, [(999, 1000)]),
    ("bytes=-1000", 1000, [(0, 1000)]),
    ("bytes=-5000", 1000, [(0, 1000)]),
    ("bytes=000-009", 1000, [(0, 10)]),
    ("bytes=0-0", 1, [(0, 1)]),
    ("bytes=-1", 1, [(0, 1)]),
    # several: disjoint ones keep the request order
    ("bytes=0-9,20-29", 1000, [(0, 10), (20, 30)]),
    ("bytes=20-29,0-9", 1000, [(20, 30), (0, 10)]),
    ("bytes=-10,0-9", 1000, [(990, 1000), (0, 10)]),
    ("bytes=0-9,11-19", 1000, [(0, 10), (11, 20)]),
    # ... overlapping or adjacent ones are sorted and merged, all of them
    ("bytes=0-99,50-149", 1000, [(0, 150)]),
    ("bytes=0-9,10-19", 1000, [(0, 20)]),
    ("bytes=10-19,0-9", 1000, [(0, 20)]),
    ("bytes=0-9,0-9", 1000, [(0, 10)]),
    ("bytes=0-99,10-19", 1000, [(0, 100)]),
    ("bytes=500-509,0-9,5-14", 1000, [(0, 15), (500, 510)]),
    ("bytes=-10,980-989", 1000, [(980, 1000)]),
    # unsatisfiable specs are dropped ...
    ("bytes=0-9,5000-6000", 1000, [(0, 10)]),
    ("bytes=-0,5-6", 1000, [(5, 7)]),
    # ... and if none is left: 416
    ("bytes=1000-", 1000, NOT_SATISFIABLE),
    ("bytes=1000-2000", 1000, NOT_SATISFIABLE),
    ("bytes=-0", 1000, NOT_SATISFIABLE),
    ("bytes=-0,2000-,1000-1000", 1000, NOT_SATISFIABLE),
    ("bytes=0-", 0, NOT_SATISFIABLE),
    ("bytes=0-0", 0, NOT_SATISFIABLE),
    ("bytes=-5", 0, NOT_SATISFIABLE),
    ("bytes=-0", 0, NOT_SATISFIABLE),
    # whitespace around commas, empty elements, unit case
    ("bytes=0-1 , 5-6", 1000, [(0, 2), (5, 7)]),
    ("bytes= 0-1,\t5-6 ", 1000, [(0, 2), (5, 7)]),
    ("bytes=0-1,,5-6", 1000, [(0, 2), (5, 7)]),
    ("bytes=,0-1,", 1000, [(0, 2)]),
    ("Bytes=0-1", 1000, [(0, 2)]),
    ("BYTES=0-1", 1000, [(0, 2)]),
    # ignored: absent, not unit=..., another unit (RFC 9110 §14.2: MUST ignore)
    (None, 1000, None),
    ("", 1000, None),
    ("bytes", 1000, None),
    ("items=0-1", 1000, None),
    ("none=0-1", 1000, None),
    ("bytes 0-1", 1000, None),
    ("=0-1", 1000, None),
    # rejected with 416: an invalid bytes range set, even next to valid or unsatisfiable specs
    ("bytes=", 1000, INVALID),
    ("bytes=,", 1000, INVALID),
    ("bytes= , ,", 1000, INVALID),
    ("bytes==0-1", 1000, INVALID),
    ("bytes=-", 1000, INVALID),
    ("bytes=1", 1000, INVALID),
    ("bytes=a-b", 1000, INVALID),
    ("bytes=5-2", 1000, INVALID),
    ("bytes=0-1,5-2", 1000, INVALID),
    ("bytes=5-2", 0, INVALID),
    ("bytes=2000-,x", 1000, INVALID),
    ("bytes=+1-2", 1000, INVALID),
    ("bytes=1-+2", 1000, INVALID),
    ("bytes=--1", 1000, INVALID),
    ("bytes=-+1", 1000, INVALID),
    ("bytes=-1-", 1000, INVALID),
    ("bytes=1 -2", 1000, INVALID),
    ("bytes=1- 2", 1000, INVALID),
    ("bytes=1 2-3", 1000, INVALID),
    ("bytes=0x1-2", 1000, INVALID),
    ("bytes=1.0-2", 1000, INVALID),
    ("bytes=1-2-3", 1000, INVALID),
    ("bytes=0-1;q=1", 1000, INVALID),
    ("bytes=\uff11-2", 1000, INVALID),  # fullwidth digit: int() would accept it
    ("bytes=\u0661-2", 1000, INVALID),  # Arabic-Indic digit
    # amplification guards: requested bytes beyond the size, too many ranges after coalescing
    ("bytes=0-,0-", 1000, None),
    ("bytes=0-599,400-999", 1000, None),
    ("bytes=-600,0-599", 1000, None),
    ("bytes=0-1,1-2", 1000, [(0, 3)]),
    (
        ",".join(["bytes=0-0"] + [f"{2 * i}-{2 * i}" for i in range(1, 16)]),
        1000,
        [(2 * i, 2 * i + 1) for i in range(16)],
    ),
    (",".join(["bytes=0-0"] + [f"{2 * i}-{2 * i}" for i in range(1, 17)]), 1000, None),
]


def check_ranges(header: str | None, size: int, expected: object, max_ranges: int = 16) -> None:
    if expected == INVALID:
        with pytest.raises(InvalidRange):
            parse_ranges(header, size, max_ranges=max_ranges)
    elif expected == NOT_SATISFIABLE:
        with pytest.raises(RangeNotSatisfiable) as raised:
            parse_ranges(header, size, max_ranges=max_ranges)
        assert not isinstance(raised.value, InvalidRange)
    else:
        expected = [ByteRange(a, b) for a, b in expected] if isinstance(expected, list) else expected
        assert parse_ranges(header, size, max_ranges=max_ranges) == expected


@pytest.mark.parametrize(("header", "size", "expected"), RANGE_CASES)
def test_parse_ranges(header: str | None, size: int, expected: object) -> None:
    check_ranges(header, size, expected)


@pytest.mark.parametrize(
    ("header", "max_ranges", "expected"),
    [
        ("bytes=0-1,5-6", 1, None),
        ("bytes=0-1,2-3", 1, [(0, 4)]),  # counted after coalescing
        ("bytes=0-1,5-6", 2, [(0, 2), (5, 7)]),
        ("bytes=0-1,5-6,9-10", 2, None),
    ],
)
def test_parse_ranges_max_ranges(header: str, max_ranges: int, expected: object) -> None:
    check_ranges(header, 1000, expected, max_ranges)


def test_parse_ranges_thousands_of_ranges() -> None:
    size = 100_000
    sparse = "bytes=" + ",".join(f"{2 * i}-{2 * i}" for i in range(5000))
    assert parse_ranges(sparse, size) is None
    adjacent = "bytes=" + ",".join(f"{i}-{i}" for i in reversed(range(5000)))
    assert parse_ranges(adjacent, size) == [ByteRange(0, 5000)]
    repeated = "bytes=" + ",".join(["0-0"] * 5000)
    assert parse_ranges(repeated, size) == [ByteRange(0, 1)]
    repeated_whole = "bytes=" + ",".join(["0-"] * 5000)
    assert parse_ranges(repeated_whole, size) is None


HUGE = "9" * 10_000  # int() of this raises ValueError (int_max_str_digits) on 3.11+


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (f"bytes=0-{HUGE}", [(0, 1000)]),
        (f"bytes=10-{HUGE}", [(10, 1000)]),
        (f"bytes={HUGE}-", NOT_SATISFIABLE),
        (f"bytes={HUGE}-{HUGE}", NOT_SATISFIABLE),
        (f"bytes=-{HUGE}", [(0, 1000)]),
        (f"bytes={'0' * 10_000}5-{HUGE}", [(5, 1000)]),
        (f"bytes=-{'0' * 10_000}7", [(993, 1000)]),
        (f"bytes=1{'0' * 5000}-{'9' * 5000}", INVALID),  # a > b, both huge
        (f"bytes={'9' * 5000}-1{'0' * 5000}", NOT_SATISFIABLE),  # a < b, both huge
    ],
)
def test_parse_ranges_huge_numbers(header: str, expected: object) -> None:
    check_ranges(header, 1000, expected)


# -- parse_ranges: properties against a reference model ----------------------------

Spec = tuple[str, int, int]


@st.composite
def range_requests(draw: st.DrawFn) -> tuple[int, list[Spec]]:
    """A size and specs scaled to it: short ones anywhere (some past the end), half the time long ones."""
    size = draw(st.integers(0, 2000))
    offset = st.integers(0, size + 50)
    short = st.integers(0, min(40, size // 8))
    long = st.integers(0, size + 100)
    zeros = st.integers(0, 2)  # leading zeros for a- and -n
    specs = [
        st.tuples(st.just("int"), offset, short),  # a, b - a
        st.tuples(st.just("open"), st.integers(max(size - 40, 0), size + 10), zeros),  # a
        st.tuples(st.just("suffix"), short, zeros),  # n
    ]
    if draw(st.booleans()):  # long ones too, which often trip the requested > size guard
        specs += [
            st.tuples(st.just("int"), offset, long),
            st.tuples(st.just("open"), offset, zeros),
            st.tuples(st.just("suffix"), long, zeros),
        ]
    spec = st.one_of(*specs)
    return size, draw(st.lists(spec, min_size=1, max_size=24))


SEPARATORS = st.sampled_from([",", ", ", " ,", " , ", ",\t", ",,", ", ,"])
UNITS = st.sampled_from(["bytes", "Bytes", "BYTES"])


def render(spec: Spec) -> str:
    kind, a, n = spec
    if kind == "int":
        return f"{a}-{a + n}"
    if kind == "open":
        return f"{'0' * n}{a}-"
    return f"-{'0' * n}{a}"


def reference(specs: list[Spec], size: int) -> list[tuple[int, int]]:
    """The satisfiable [start, stop) of each spec, in request order."""
    out = []
    for kind, a, n in specs:
        if kind == "int":
            start, stop = a, min(a + n, size - 1) + 1
        elif kind == "open":
            start, stop = a, size
        else:
            start, stop = max(size - a, 0), size
        if start < stop:
            out.append((start, stop))
    return out


def runs(covered: set[int]) -> int:
    return sum(1 for i in covered if i - 1 not in covered)


@PROPERTY
@given(
    request=range_requests(),
    unit=UNITS,
    seps=st.lists(SEPARATORS, min_size=24, max_size=24),
    max_ranges=st.sampled_from([1, 2, 4, 16]),
)
def test_parse_ranges_matches_reference(
    request: tuple[int, list[Spec]], unit: str, seps: list[str], max_ranges: int
) -> None:
    size, specs = request
    header = unit + "=" + "".join(sep + render(s) for sep, s in zip(seps, specs, strict=False))[1:]
    satisfiable = reference(specs, size)
    covered = {i for start, stop in satisfiable for i in range(start, stop)}
    if not covered:
        with pytest.raises(RangeNotSatisfiable):
            parse_ranges(header, size, max_ranges=max_ranges)
        return
    result = parse_ranges(header, size, max_ranges=max_ranges)
    requested = sum(stop - start for start, stop in satisfiable)
    assert (result is None) == (requested > size or runs(covered) > max_ranges)
    if result is None:
        return
    assert result
    assert all(0 <= r.start < r.stop <= size for r in result)
    assert {i for r in result for i in range(r.start, r.stop)} == covered
    ordered = sorted(result, key=lambda r: r.start)
    assert all(a.stop < b.start for a, b in itertools.pairwise(ordered))  # disjoint, not even touching
    touching = any(a[1] >= b[0] for a, b in itertools.pairwise(sorted(satisfiable)))
    if touching:
        assert result == ordered
    else:
        assert result == [ByteRange(a, b) for a, b in satisfiable]


INVALID_SPECS = st.sampled_from(
    ["5-2", "-", "a-b", "+1-2", "1-+2", "--5", "1 -2", "1- 2", "0x10-", "1-2-3", "\uff15-6", "1.5-2", "7"]
)


@QUICK_PROPERTY
@given(request=range_requests(), bad=INVALID_SPECS, where=st.integers(0, 24))
def test_parse_ranges_rejects_any_invalid_spec(request: tuple[int, list[Spec]], bad: str, where: int) -> None:
    size, specs = request
    parts = [render(s) for s in specs]
    parts.insert(where, bad)
    with pytest.raises(InvalidRange):
        parse_ranges("bytes=" + ",".join(parts), size)


@QUICK_PROPERTY
@given(request=range_requests(), unit=st.sampled_from(["items", "byte", "bytess", "none", ""]))
def test_parse_ranges_ignores_other_units(request: tuple[int, list[Spec]], unit: str) -> None:
    size, specs = request
    assert parse_ranges(unit + "=" + ",".join(map(render, specs)), size) is None


# -- ETags and dates -----------------------------------------------------------------

LM = 784111777  # Sun, 06 Nov 1994 08:49:37 GMT
ETAG = make_etag(1_700_000_000_123_456_789, 1000)


def test_make_etag() -> None:
    assert make_etag(0x10, 0x20) == '"10-20"'
    assert make_etag(1_700_000_000_123_456_789, 1000) == '"17979cfe3d85cd15-3e8"'
    assert make_etag(1, 2) != make_etag(1, 3) != make_etag(2, 3)
    assert parse_etag_list(ETAG) == [(False, ETAG)]  # a valid strong entity-tag


@pytest.mark.parametrize(
    ("timestamp", "expected"),
    [
        (LM, "Sun, 06 Nov 1994 08:49:37 GMT"),
        (LM + 0.999, "Sun, 06 Nov 1994 08:49:37 GMT"),
        (0, "Thu, 01 Jan 1970 00:00:00 GMT"),
        (951782400, "Tue, 29 Feb 2000 00:00:00 GMT"),
        (-1, "Wed, 31 Dec 1969 23:59:59 GMT"),
    ],
)
def test_http_date(timestamp: float, expected: str) -> None:
    assert http_date(timestamp) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("Sun, 06 Nov 1994 08:49:37 GMT", LM),  # IMF-fixdate
        ("Sunday, 06-Nov-94 08:49:37 GMT", LM),  # obsolete RFC 850
        ("Sun Nov  6 08:49:37 1994", LM),  # obsolete asctime, GMT by definition
        ("  Sun, 06 Nov 1994 08:49:37 GMT ", LM),
        ("Sun, 06 Nov 1994 08:49:37 +0200", LM - 7200),
        (None, None),
        ("", None),
        ("garbage", None),
        ("0", None),
        ("1994", None),
        ("Sun, 31 Feb 1994 08:49:37 GMT", None),
        ("Sun, 06 Nov 1994 25:49:37 GMT", None),
        ("Sun, 06 Nov 99999 08:49:37 GMT", None),
    ],
)
def test_parse_http_date(value: str | None, expected: int | None) -> None:
    assert parse_http_date(value) == expected


def test_parse_http_date_zoneless_forms_are_gmt_whatever_the_local_zone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        assert parse_http_date("Sun Nov  6 08:49:37 1994") == LM
        assert parse_http_date("Sun, 06 Nov 1994 08:49:37 -0000") == LM
    finally:
        monkeypatch.undo()
        time.tzset()


@QUICK_PROPERTY
@given(st.integers(-2_208_988_800, 253_402_300_799))  # 1900 .. 9999
def test_http_date_round_trip(timestamp: int) -> None:
    value = http_date(timestamp)
    assert re.fullmatch(r"[A-Z][a-z]{2}, \d\d [A-Z][a-z]{2} \d{4} \d\d:\d\d:\d\d GMT", value)
    assert parse_http_date(value) == timestamp


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ('"a"', [(False, '"a"')]),
        ('W/"a"', [(True, '"a"')]),
        ('"a", W/"b" ,"c"', [(False, '"a"'), (True, '"b"'), (False, '"c"')]),
        ('"a,b", "c"', [(False, '"a,b"'), (False, '"c"')]),  # commas are etagc
        ('""', [(False, '""')]),
        ("*", None),
        (" * ", None),
        ("", []),
        (',, "a" ,,', [(False, '"a"')]),
        ('"a", *', [(False, '"a"')]),  # "*" is only valid alone
        ("a", []),
        ('"a', []),
        ('w/"a"', []),  # W/ is case-sensitive
        ('"a b", "c"', [(False, '"c"')]),
        ('"a"x, "b"', [(False, '"b"')]),
        ('"a" "b", "c"', [(False, '"c"')]),
    ],
)
def test_parse_etag_list(value: str, expected: list[tuple[bool, str]] | None) -> None:
    assert parse_etag_list(value) == expected


# -- preconditions -------------------------------------------------------------------

BEFORE, EQUAL, AFTER = http_date(LM - 1), http_date(LM), http_date(LM + 1)


def cimd(headers: Mapping[str, str] | list[tuple[str, str]]) -> CIMultiDictProxy[str]:
    return CIMultiDictProxy(CIMultiDict(headers))


PRECONDITION_CASES: list[tuple[str, dict[str, str], int | None]] = [
    ("GET", {}, None),
    ("POST", {}, None),
    # If-Match: strong comparison, "*" matches
    ("GET", {"If-Match": ETAG}, None),
    ("GET", {"If-Match": "*"}, None),
    ("GET", {"If-Match": f'"x", {ETAG}'}, None),
    ("GET", {"If-Match": '"x"'}, 412),
    ("GET", {"If-Match": f"W/{ETAG}"}, 412),
    ("GET", {"If-Match": ""}, 412),
    ("PUT", {"If-Match": ETAG}, None),
    ("PUT", {"If-Match": '"x"'}, 412),
    # If-Unmodified-Since
    ("GET", {"If-Unmodified-Since": EQUAL}, None),
    ("GET", {"If-Unmodified-Since": AFTER}, None),
    ("GET", {"If-Unmodified-Since": BEFORE}, 412),
    ("PUT", {"If-Unmodified-Since": BEFORE}, 412),
    ("GET", {"If-Unmodified-Since": "garbage"}, None),
    # ... is ignored when If-Match is present, either way
    ("GET", {"If-Match": ETAG, "If-Unmodified-Since": BEFORE}, None),
    ("GET", {"If-Match": '"x"', "If-Unmodified-Since": AFTER}, 412),
    # If-None-Match: weak comparison, "*" matches; 304 for GET/HEAD, 412 otherwise
    ("GET", {"If-None-Match": ETAG}, 304),
    ("HEAD", {"If-None-Match": ETAG}, 304),
    ("GET", {"If-None-Match": f"W/{ETAG}"}, 304),
    ("GET", {"If-None-Match": f'"x", {ETAG}'}, 304),
    ("GET", {"If-None-Match": "*"}, 304),
    ("GET", {"If-None-Match": '"x"'}, None),
    ("POST", {"If-None-Match": ETAG}, 412),
    ("PUT", {"If-None-Match": "*"}, 412),
    ("DELETE", {"If-None-Match": f"W/{ETAG}"}, 412),
    ("POST", {"If-None-Match": '"x"'}, None),
    # If-Modified-Since: GET/HEAD only
    ("GET", {"If-Modified-Since": EQUAL}, 304),
    ("HEAD", {"If-Modified-Since": AFTER}, 304),
    ("GET", {"If-Modified-Since": BEFORE}, None),
    ("GET", {"If-Modified-Since": "garbage"}, None),
    ("POST", {"If-Modified-Since": EQUAL}, None),
    # ... is ignored when If-None-Match is present, either way
    ("GET", {"If-None-Match": '"x"', "If-Modified-Since": EQUAL}, None),
    ("GET", {"If-None-Match": ETAG, "If-Modified-Since": BEFORE}, 304),
    # precedence: the 412 checks come first
    ("GET", {"If-Match": '"x"', "If-None-Match": ETAG}, 412),
    ("GET", {"If-Match": '"x"', "If-Modified-Since": EQUAL}, 412),
    ("GET", {"If-Unmodified-Since": BEFORE, "If-None-Match": ETAG}, 412),
    ("GET", {"If-Unmodified-Since": BEFORE, "If-Modified-Since": EQUAL}, 412),
    ("GET", {"If-Match": ETAG, "If-None-Match": ETAG}, 304),
    ("GET", {"If-Match": "*", "If-Modified-Since": AFTER}, 304),
    ("GET", {"If-Unmodified-Since": AFTER, "If-None-Match": "*"}, 304),
    ("GET", {"If-Unmodified-Since": EQUAL, "If-Modified-Since": EQUAL}, 304),
    (
        "GET",
        {"If-Match": ETAG, "If-Unmodified-Since": BEFORE, "If-None-Match": '"x"', "If-Modified-Since": AFTER},
        None,
    ),
]


@pytest.mark.parametrize(("method", "headers", "expected"), PRECONDITION_CASES)
def test_evaluate_preconditions(method: str, headers: dict[str, str], expected: int | None) -> None:
    assert evaluate_preconditions(method, cimd(headers), ETAG, LM) == expected
    assert evaluate_preconditions(method, headers, ETAG, LM) == expected  # a plain Mapping works too
    lowered = cimd({k.lower(): v for k, v in headers.items()})
    assert evaluate_preconditions(method, lowered, ETAG, LM) == expected


# Every combination, against RFC 9110 §13.2.2 spelled out step by step.
IF_MATCH = {"absent": None, "match": ETAG, "star": "*", "weak": f"W/{ETAG}", "other": '"x"'}
IF_UNMODIFIED = {"absent": None, "equal": EQUAL, "after": AFTER, "before": BEFORE, "invalid": "nope"}
IF_NONE_MATCH = {"absent": None, "match": ETAG, "star": "*", "weak": f"W/{ETAG}", "other": '"x"'}
IF_MODIFIED = {"absent": None, "equal": EQUAL, "after": AFTER, "before": BEFORE, "invalid": "nope"}


def rfc_steps(method: str, im: str, ius: str, inm: str, ims: str) -> int | None:
    safe = method in ("GET", "HEAD")
    if im != "absent":  # step 1
        if im not in ("match", "star"):
            return 412
    elif ius in ("before",):  # step 2
        return 412
    if inm != "absent":  # step 3
        if inm != "other":
            return 304 if safe else 412
    elif safe and ims in ("equal", "after"):  # step 4
        return 304
    return None


@pytest.mark.parametrize("method", ["GET", "HEAD", "POST", "PUT", "DELETE"])
def test_evaluate_preconditions_every_combination(method: str) -> None:
    for im, ius, inm, ims in itertools.product(IF_MATCH, IF_UNMODIFIED, IF_NONE_MATCH, IF_MODIFIED):
        values = {
            "If-Match": IF_MATCH[im],
            "If-Unmodified-Since": IF_UNMODIFIED[ius],
            "If-None-Match": IF_NONE_MATCH[inm],
            "If-Modified-Since": IF_MODIFIED[ims],
        }
        headers = cimd({k: v for k, v in values.items() if v is not None})
        expected = rfc_steps(method, im, ius, inm, ims)
        assert evaluate_preconditions(method, headers, ETAG, LM) == expected, (method, im, ius, inm, ims)


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        ([("If-None-Match", '"x"'), ("If-None-Match", ETAG)], 304),  # list fields combine
        ([("If-Match", '"x"'), ("if-match", ETAG)], None),
        ([("If-Modified-Since", EQUAL), ("If-Modified-Since", EQUAL)], None),  # two dates: ignored
        ([("If-Unmodified-Since", BEFORE), ("If-Unmodified-Since", BEFORE)], None),
    ],
)
def test_evaluate_preconditions_repeated_field_lines(
    lines: list[tuple[str, str]], expected: int | None
) -> None:
    assert evaluate_preconditions("GET", cimd(lines), ETAG, LM) == expected


@pytest.mark.parametrize(
    ("if_range", "expected"),
    [
        (None, True),
        (ETAG, True),
        (f" {ETAG} ", True),
        ('"x"', False),
        (f"W/{ETAG}", False),  # weak tags never match
        (f"{ETAG}, {ETAG}", False),  # one entity-tag only
        (ETAG[:-1], False),
        ("W/", False),
        (EQUAL, True),
        ("Sunday, 06-Nov-94 08:49:37 GMT", True),
        ("Sun Nov  6 08:49:37 1994", True),
        (BEFORE, False),
        (AFTER, False),  # exact match only
        ("garbage", False),
        ("", False),
    ],
)
def test_if_range_allows(if_range: str | None, expected: bool) -> None:
    assert if_range_allows(if_range, ETAG, LM) is expected


def test_if_range_never_matches_a_weak_validator() -> None:
    assert not if_range_allows('W/"a"', 'W/"a"', LM)
    assert not if_range_allows('"a"', 'W/"a"', LM)


# -- Accept-Encoding -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        (None, None),
        ("", None),
        (" ", None),
        ("gzip", "gzip"),
        ("br", "br"),
        ("gzip, br", "br"),  # equal q: server order
        ("gzip, deflate, br, zstd", "br"),
        ("deflate", None),
        ("identity", None),
        ("GZIP", "gzip"),
        ("x-gzip", "gzip"),
        (" , gzip ,,", "gzip"),
        # q-values
        ("gzip;q=1, br;q=0.5", "gzip"),
        ("br;q=0.001, gzip;q=0.002", "gzip"),
        ("gzip ; Q=0.5", "gzip"),
        ("gzip;q=1.000", "gzip"),
        ("gzip;q=0.5", "gzip"),  # identity not weighed: a listed coding wins
        ("br;q=0, gzip", "gzip"),
        ("br;q=0.000, gzip;q=0", None),
        ("gzip, gzip;q=0", None),  # repeated: the lowest q counts
        ("gzip;q=0, gzip", None),
        ("gzip;level=9", "gzip"),  # unknown parameters are ignored
        # malformed q: the member is ignored
        ("gzip;q=2", None),
        ("gzip;q=abc", None),
        ("gzip;q=0.0001", None),
        ("gzip;q=-1", None),
        ("gzip;q=abc;q=1", None),
        ("gzip;q=", None),
        ("gzip;q=2, br", "br"),
        ("g zip", None),
        # "*" covers unlisted codings
        ("*", "br"),
        ("*;q=0", None),
        ("*, br;q=0", "gzip"),
        ("*;q=0.5, gzip", "gzip"),
        ("*;q=0.5, gzip;q=0.4", "br"),
        ("*;q=0, gzip", "gzip"),
        # identity competes only when weighed explicitly or by "*"
        ("gzip;q=0.5, identity", None),
        ("gzip;q=0.5, identity;q=0.5", "gzip"),
        ("gzip, identity;q=0", "gzip"),
        ("identity;q=0", None),  # nothing else acceptable: identity anyway
        ("*;q=1, gzip;q=0.5", "br"),
    ],
)
def test_choose_encoding(accept: str | None, expected: str | None) -> None:
    assert choose_encoding(accept, ("br", "gzip")) == expected


@pytest.mark.parametrize(
    ("accept", "available", "expected"),
    [
        ("br, gzip", ("gzip", "br"), "gzip"),
        ("br, gzip", (), None),
        ("gzip", ("identity", "gzip"), "gzip"),
        ("identity", ("identity",), None),
        ("*;q=1, gzip;q=0.5", ("gzip",), None),  # identity (via "*") is preferred
        ("zstd;q=0.9, br;q=0.8", ("zstd", "br", "gzip"), "zstd"),
        ("gzip", ("x-gzip",), "x-gzip"),  # returned as the server spelt it
    ],
)
def test_choose_encoding_available(accept: str, available: tuple[str, ...], expected: str | None) -> None:
    assert choose_encoding(accept, available) == expected


# -- multipart/byteranges ------------------------------------------------------------


def assemble(parts: list[tuple[bytes, ByteRange]], closing: bytes, data: bytes) -> bytes:
    return b"".join(header + data[r.start : r.stop] for header, r in parts) + closing


def test_multipart_byteranges_layout() -> None:
    ranges = [ByteRange(0, 2), ByteRange(5, 8)]
    parts, closing, total = multipart_byteranges(ranges, 10, "text/plain", "BOUNDARY")
    assert parts == [
        (b"\r\n--BOUNDARY\r\nContent-Type: text/plain\r\nContent-Range: bytes 0-1/10\r\n\r\n", ranges[0]),
        (b"\r\n--BOUNDARY\r\nContent-Type: text/plain\r\nContent-Range: bytes 5-7/10\r\n\r\n", ranges[1]),
    ]
    assert closing == b"\r\n--BOUNDARY--\r\n"
    body = assemble(parts, closing, b"0123456789")
    assert total == len(body)
    assert body == (
        b"\r\n--BOUNDARY\r\nContent-Type: text/plain\r\nContent-Range: bytes 0-1/10\r\n\r\n01"
        b"\r\n--BOUNDARY\r\nContent-Type: text/plain\r\nContent-Range: bytes 5-7/10\r\n\r\n567"
        b"\r\n--BOUNDARY--\r\n"
    )


def test_multipart_byteranges_without_content_type() -> None:
    parts, _, _ = multipart_byteranges([ByteRange(1, 2)], 3, "", "b")
    assert parts == [(b"\r\n--b\r\nContent-Range: bytes 1-1/3\r\n\r\n", ByteRange(1, 2))]


def test_multipart_byteranges_reads_back_with_the_stdlib_mime_parser() -> None:
    data = b"The quick brown fox jumps over the lazy dog"
    ranges = [ByteRange(4, 9), ByteRange(40, 43), ByteRange(0, 3)]
    boundary = "3d6b6a416f9b5"
    parts, closing, total = multipart_byteranges(ranges, len(data), "text/plain; charset=utf-8", boundary)
    body = assemble(parts, closing, data)
    assert total == len(body)
    head = f"Content-Type: multipart/byteranges; boundary={boundary}\r\n\r\n".encode()
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
    assert message.defects == []
    payloads = message.get_payload()
    assert isinstance(payloads, list)
    got = []
    for part in payloads:
        assert isinstance(part, email.message.Message)
        got.append((part["Content-Range"], part.get_content_type(), part.get_payload(decode=True)))
    assert got == [
        ("bytes 4-8/43", "text/plain", b"quick"),
        ("bytes 40-42/43", "text/plain", b"dog"),
        ("bytes 0-2/43", "text/plain", b"The"),
    ]


@pytest.mark.parametrize(
    ("ranges", "content_type", "boundary", "match"),
    [
        ([], "text/plain", "b", "at least one range"),
        ([ByteRange(0, 11)], "text/plain", "b", "beyond the size"),
        ([ByteRange(0, 1)], "text/plain", "", "boundary"),
        ([ByteRange(0, 1)], "text/plain", "x" * 71, "boundary"),
        ([ByteRange(0, 1)], "text/plain", "ends with space ", "boundary"),
        ([ByteRange(0, 1)], "text/plain", "a\r\nb", "boundary"),
        ([ByteRange(0, 1)], "text/plain\r\nX-Evil: 1", "b", "content type"),
    ],
)
def test_multipart_byteranges_rejects(
    ranges: list[ByteRange], content_type: str, boundary: str, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        multipart_byteranges(ranges, 10, content_type, boundary)


BCHARS = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ'()+_,-./:=? "


@st.composite
def byte_ranges(draw: st.DrawFn) -> tuple[int, list[ByteRange]]:
    size = draw(st.integers(1, 3000))
    spans = draw(st.lists(st.tuples(st.integers(0, size - 1), st.integers(1, size)), min_size=1, max_size=20))
    return size, [ByteRange(start, min(start + n, size)) for start, n in spans]


@PROPERTY
@given(
    sized=byte_ranges(),
    content_type=st.sampled_from(["", "application/octet-stream", "text/plain; charset=utf-8"]),
    boundary=st.text(BCHARS, min_size=1, max_size=70).filter(lambda b: not b.endswith(" ")),
)
def test_multipart_byteranges_round_trip(
    sized: tuple[int, list[ByteRange]], content_type: str, boundary: str
) -> None:
    size, ranges = sized
    data = pattern(size)
    parts, closing, total = multipart_byteranges(ranges, size, content_type, boundary)
    assert [r for _, r in parts] == ranges
    body = assemble(parts, closing, data)
    assert total == len(body)
    expected_type = content_type.encode() if content_type else None
    assert parse_multipart(body, boundary.encode()) == [
        (expected_type, r.content_range(size).encode(), data[r.start : r.stop]) for r in ranges
    ]


# -- a file's response headers -------------------------------------------------------


def test_file_headers_every_answer_carries_the_validators_and_range_support() -> None:
    etag = make_etag(1_700_000_000_123_456_789, 4096)
    assert file_headers(etag, 1_700_000_000) == [
        ("Etag", etag),  # aiohttp's spelling (hdrs.ETAG): the bytes on the wire
        ("Last-Modified", "Tue, 14 Nov 2023 22:13:20 GMT"),
        ("Accept-Ranges", "bytes"),
    ]


def test_file_headers_add_what_is_given_in_the_order_sent() -> None:
    etag = make_etag(5, 10)
    base = file_headers(etag, 0)
    assert file_headers(
        etag, 0, vary=True, encoding="br", content_type="text/css", content_range="bytes 0-4/10"
    ) == [
        *base,
        ("Vary", "Accept-Encoding"),
        ("Content-Encoding", "br"),
        ("Content-Type", "text/css"),
        ("Content-Range", "bytes 0-4/10"),
    ]
    # A 416 answer: no Content-Type, the unsatisfied range's Content-Range.
    assert file_headers(etag, 0, content_range="bytes */10") == [*base, ("Content-Range", "bytes */10")]
    assert dict(file_headers(etag, 1_700_000_000))["Last-Modified"] == http_date(1_700_000_000)
