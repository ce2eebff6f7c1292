"""The generated parts of docs/ match the code: the HTTP reference is the OpenAPI document
of today's app, the CLI reference today's ``--help``, the configuration reference
today's ``ledgermq broker`` parser, and the byte examples of
docs/formats.md are what today's encoders write (``tools/format_examples.py`` asserts
its tables against the decoders)."""

from __future__ import annotations

import pytest

from tools import docgen

GENERATED = docgen.generated()  # built once: an app, the CLI's parsers, the examples


@pytest.mark.parametrize("path", sorted(GENERATED), ids=lambda p: p.name)
def test_generated_docs_are_up_to_date(path) -> None:  # type: ignore[no-untyped-def]
    assert path.read_text(encoding="utf-8") == GENERATED[path], "run `python -m tools.docgen`"


def test_the_shell_environment_does_not_leak_into_the_references(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LEDGERMQ_DEFAULT_QUEUES", "3")  # would be --default-queues' default
    assert (
        docgen.configuration_reference()
        == GENERATED[docgen.DOCS / "reference" / "configuration.md"]
    )
    assert docgen.cli_reference() == GENERATED[docgen.DOCS / "reference" / "cli.md"]


def test_every_broker_option_is_in_the_configuration_reference() -> None:
    text = GENERATED[docgen.DOCS / "reference" / "configuration.md"]
    parser = docgen._sub_parser(docgen.build_parser(), "broker")
    options = [a.option_strings[0] for a in parser._actions if a.option_strings[1:2] != ["--help"]]
    assert len(options) > 50
    for option in options:
        assert f"| `{option}` | `{docgen.env_name(option)}` |" in text, option


def test_a_region_without_its_end_is_refused() -> None:
    with pytest.raises(ValueError, match="end generated"):
        docgen.fill_regions("<!-- generated: log-hexdump -->\nno end\n", {"log-hexdump": "x"})


def test_an_unknown_region_is_refused() -> None:
    text = "<!-- generated: nope -->\n<!-- end generated -->\n"
    with pytest.raises(KeyError, match="nope"):
        docgen.fill_regions(text, {})


def test_regions_are_filled_in_place() -> None:
    text = "a\n<!-- generated: x -->\nold\n<!-- end generated -->\nb\n"
    assert docgen.fill_regions(text, {"x": "new"}) == (
        "a\n<!-- generated: x -->\nnew\n<!-- end generated -->\nb\n"
    )
