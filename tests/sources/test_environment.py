"""``read_variables``: the CLI's variables as pydantic-settings reads them."""

from __future__ import annotations

from kvdoctor.sources.environment import read_variables


def test_only_the_named_variables_set_to_something_are_read():
    environ = {"KVDOCTOR_A": "1", "KVDOCTOR_B": "", "KVDOCTOR_C": "  ", "KVDOCTOR_OTHER": "x", "kvdoctor_d": "2"}
    assert read_variables(["KVDOCTOR_A", "KVDOCTOR_B", "KVDOCTOR_C", "KVDOCTOR_D"], environ) == {"KVDOCTOR_A": "1"}


def test_values_stay_text_for_the_flag_to_check():
    assert read_variables(["KVDOCTOR_X"], {"KVDOCTOR_X": ' {"a": 1} '}) == {"KVDOCTOR_X": ' {"a": 1} '}


def test_without_a_mapping_the_process_environment_is_read(monkeypatch):
    monkeypatch.setenv("KVDOCTOR_TEST_ENVIRONMENT", "on")
    assert read_variables(["KVDOCTOR_TEST_ENVIRONMENT"]) == {"KVDOCTOR_TEST_ENVIRONMENT": "on"}
    assert read_variables(["KVDOCTOR_TEST_ENVIRONMENT"], {}) == {}
