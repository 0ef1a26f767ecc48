import orjson
import pytest

from producers.models import RequestError, parse_jobs


def parse(doc, max_batch=100, max_params=1000):
    body = doc if isinstance(doc, bytes) else orjson.dumps(doc)
    return parse_jobs(body, max_batch, max_params)


def test_single_job_and_batch():
    assert parse({"workflow": "w", "params": {"a": 1}})[0].params == {"a": 1}
    jobs = parse({"jobs": [{"workflow": "w"}, {"workflow": "w", "job_id": "j1"}]})
    assert [j.job_id for j in jobs] == [None, "j1"]


def test_batch_of_100_is_fine():
    assert len(parse({"jobs": [{"workflow": "w"}] * 100})) == 100


def _error(doc, **kw) -> RequestError:
    with pytest.raises(RequestError) as info:
        parse(doc, **kw)
    return info.value


def test_invalid_job_id_names_the_field():
    err = _error({"jobs": [{"workflow": "w"}, {"workflow": "w", "job_id": "no spaces"}]})
    assert err.status == 422
    assert err.body.fields[0].field == "jobs[1].job_id"


def test_over_long_job_id():
    err = _error({"workflow": "w", "job_id": "x" * 101})
    assert err.body.fields[0].field == "job_id"


def test_missing_workflow_and_unknown_field():
    err = _error({"params": {}, "colour": "red"})
    assert {f.field for f in err.body.fields} == {"workflow", "colour"}


def test_batch_over_limit():
    err = _error({"jobs": [{"workflow": "w"}] * 11}, max_batch=10)
    assert (err.status, err.body.error, err.body.fields[0].field) == (
        422,
        "batch_too_large",
        "jobs",
    )


def test_params_too_large():
    err = _error({"jobs": [{"workflow": "w", "params": {"x": "y" * 2000}}]})
    assert (err.body.error, err.body.fields[0].field) == ("params_too_large", "jobs[0].params")


@pytest.mark.parametrize("body", [b"{", b"\xff\xfe", b""])
def test_malformed_json_is_400(body):
    assert _error(body).status == 400


def test_non_object_body():
    assert _error([1, 2]).status == 422


def test_empty_batch_rejected():
    assert _error({"jobs": []}).body.fields[0].field == "jobs"


def test_nul_characters_in_params_are_refused_at_the_edge():
    err = _error({"workflow": "w", "params": {"note": "a\u0000b"}})
    assert (err.status, err.body.fields[0].field) == (422, "params")


def test_a_backslash_u0000_text_is_not_a_nul():
    assert parse({"workflow": "w", "params": {"note": "\\u0000 is how JSON writes NUL"}})
    err = _error({"workflow": "w", "params": {"deep": [{"k\u0000": 1}]}})
    assert err.body.error == "invalid_params" and "NUL" in err.body.message


def test_too_deeply_nested_params():
    deep: dict = {}
    cursor = deep
    for _ in range(40):
        cursor["x"] = {}
        cursor = cursor["x"]
    err = _error({"workflow": "w", "params": deep}, max_params=100_000)
    assert err.body.error == "invalid_params" and "nested deeper than 32" in err.body.message
    ok: dict = {}
    cursor = ok
    for _ in range(30):
        cursor["x"] = {}
        cursor = cursor["x"]
    assert parse({"workflow": "w", "params": ok}, max_params=100_000)


def test_unknown_types_are_refused_when_types_are_known():
    known = frozenset({"order-workflow"})
    with pytest.raises(RequestError) as info:
        parse_jobs(
            orjson.dumps({"jobs": [{"workflow": "order-workflow"}, {"workflow": "nope"}]}),
            10,
            1000,
            known,
        )
    assert (info.value.status, info.value.body.error) == (422, "unknown_type")
    assert info.value.body.fields[0].field == "jobs[1].workflow"
    assert parse_jobs(orjson.dumps({"workflow": "order-workflow"}), 10, 1000, known)


# A payload is stored exactly or refused with a reason (issue 17, item 8).


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b'{"workflow":"w","workflow":"x"}', "workflow"),
        (b'{"workflow":"w","params":{"a":1,"a":2}}', "params.a"),
        (
            b'{"jobs":[{"workflow":"w"},{"workflow":"w","params":{"x":[{"k":1,"k":1}]}}]}',
            "jobs[1].params.x[0].k",
        ),
        (b'{"workflow":"w","params":{"a" :1,\n "a"\t: 2}}', "params.a"),  # spaced keys
        (b'{"jobs":[{"workflow":"w"}],"jobs":[{"workflow":"w"}]}', "jobs"),
    ],
)
def test_duplicate_keys_at_any_depth_are_refused_naming_the_path(body, field):
    err = _error(body)
    assert (err.status, err.body.error, err.body.fields[0].field) == (422, "duplicate_key", field)


@pytest.mark.parametrize(
    ("number", "field"),
    [
        (b"123456789012345678901234567890", "params.n"),
        (b"18446744073709551616", "params.n"),  # 2**64
        (b"-9223372036854775809", "params.n"),  # -2**63 - 1
    ],
)
def test_integers_beyond_64_bits_are_refused_not_rounded(number, field):
    err = _error(b'{"workflow":"w","params":{"n":' + number + b"}}")
    assert (err.status, err.body.error, err.body.fields[0].field) == (
        422,
        "number_out_of_range",
        field,
    )


def test_64_bit_integers_and_large_floats_are_kept_exactly():
    body = (
        b'{"workflow":"w","params":{"u":18446744073709551615,"i":-9223372036854775808,'
        b'"f":1e300,"g":-2.5e19}}'
    )
    params = parse(body)[0].params
    assert params == {"u": 2**64 - 1, "i": -(2**63), "f": 1e300, "g": -2.5e19}
    assert type(params["u"]) is int and type(params["f"]) is float


@pytest.mark.parametrize("number", [b"1e400", b"-1e400", b"NaN", b"Infinity"])
def test_numbers_that_are_not_finite_are_refused(number):
    assert _error(b'{"workflow":"w","params":{"n":' + number + b"}}").status == 400


def test_keys_and_colons_inside_strings_are_not_mistaken_for_duplicates():
    body = b'{"workflow":"w","params":{"a":"x\\":y","b":"at 10:30 :","c":{"a":"a"}}}'
    assert parse(body)[0].params == {"a": 'x":y', "b": "at 10:30 :", "c": {"a": "a"}}


def test_a_batch_gives_each_job_its_defaults_and_names_a_bad_field_by_index():
    docs = [
        {"workflow": "w"},
        {"workflow": "w", "job_id": None, "params": {"a": [1, {"b": None}]}, "priority": 1},
        {"workflow": "w", "job_id": "j", "priority": 5},
    ]
    jobs = parse({"jobs": docs})
    assert [(j.job_id, j.params, j.priority) for j in jobs] == [
        (None, {}, 3),
        (None, {"a": [1, {"b": None}]}, 1),
        ("j", {}, 5),
    ]
    # a bool priority is refused by JobIn (strict), named by its field
    err = _error({"jobs": [*docs, {"workflow": "w", "priority": True}]})
    assert err.body.fields[0].field == "jobs[3].priority"
