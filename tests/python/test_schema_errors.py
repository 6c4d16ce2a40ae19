"""A schema that does not compile is refused with each of its errors as <path>:<line>:<column>:
<message>, 1-based, the path as the user gave it, before anything is served."""

import pytest

import troupe

HEADER = "@0xbf5147cbbecf40c1;\n"


def refusal(schema):
    with pytest.raises(troupe.InvalidArgument) as raised:
        troupe.serve(schema, "Foo", object(), name="calc")
    return str(raised.value)


def test_a_syntax_error_names_its_file_line_and_column(tmp_path):
    schema = tmp_path / "syntax.capnp"
    schema.write_text(HEADER +
                      "interface Foo {\n"
                      "  bar @0 (x :Int32) -> (y :Int32);\n"
                      "  baz @1 (x Int32) -> ();\n"  # no ':' before the type: line 4, column 11
                      "}\n")
    message = refusal(str(schema))
    assert f"{schema}:4:11: " in message
    assert "Parse error." in message


def test_each_unknown_type_names_its_file_line_and_column(tmp_path):
    schema = tmp_path / "unknown.capnp"
    schema.write_text(HEADER +
                      "interface Foo {\n"
                      "  bar @0 (x :Nope) -> (y :Int32);\n"  # line 3, column 14
                      "  baz @1 () -> (y :AlsoNope);\n"  # line 4, column 20
                      "}\n")
    message = refusal(str(schema))
    assert f"{schema}:3:14: Not defined: Nope" in message
    assert f"{schema}:4:20: Not defined: AlsoNope" in message


def test_errors_name_files_as_given_imports_beside_them(tmp_path, monkeypatch):
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "types.capnp").write_text(
        "@0xbf5147cbbecf40c2;\n"
        "struct S { a @0 :Bogus; }\n")  # line 2, column 18
    (tmp_path / "schemas" / "main.capnp").write_text(
        HEADER +
        'using import "types.capnp".S;\n'
        'using import "missing.capnp".T;\n'  # line 3, column 14
        "interface Foo {\n"
        "  bar @0 (x :S) -> ();\n"
        "}\n")
    monkeypatch.chdir(tmp_path)
    message = refusal("schemas/main.capnp")
    assert "schemas/types.capnp:2:18: Not defined: Bogus" in message
    assert "schemas/main.capnp:3:14: Import failed: missing.capnp" in message
    assert str(tmp_path) not in message
