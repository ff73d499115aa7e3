"""The `engine` mark's rules (tests/marks.py), run on small test files of their own through pytester.

Kind: faults provoked at their bad moment: a test that needs vLLM but carries no mark would run in
neither of CI's passes (the first has no vLLM, the second runs only `-m engine`), so it must fail.
"""

from __future__ import annotations

from pathlib import Path

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parent
CONFTEST = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
from marks import pytest_collection_modifyitems, pytest_make_collect_report, pytest_runtest_makereport, register_marks


def pytest_configure(config):
    register_marks(config)
"""
NO_VLLM = 'pytest.skip("vLLM is not installed in this environment (No module named vllm)")'


def _run(pytester, files: dict[str, str], *args: str):
    pytester.makeconftest(CONFTEST)
    for name, body in files.items():
        pytester.makepyfile(**{name: "import pytest\n\n" + body})
    return pytester.runpytest_inprocess("-q", "-p", "no:cacheprovider", *args)


def test_a_test_skipped_for_want_of_vllm_fails_unless_marked(pytester):
    res = _run(pytester, {"test_a": f"def test_unmarked():\n    {NO_VLLM}\n\n\n"
                                    f"@pytest.mark.engine\ndef test_marked():\n    {NO_VLLM}\n\n\n"
                                    "def test_other_skip():\n    pytest.skip('no GPU here')\n"})
    res.assert_outcomes(failed=1, skipped=2)
    res.stdout.fnmatch_lines(["*test_unmarked skips without vLLM but is not marked `engine`*"])


def test_a_whole_file_skipped_for_want_of_vllm_must_say_vllm_in_its_name(pytester):
    body = ('pytest.skip("vLLM is not installed in this environment (No module named vllm)", allow_module_level=True)'
            "\n\n\ndef test_x():\n    pass\n")
    res = _run(pytester, {"test_other": body, "test_vllm_thing": body})
    res.assert_outcomes(errors=1, skipped=1)
    res.stdout.fnmatch_lines(["*test_other.py skips as a whole without vLLM but its name does not start with 'test_vllm'*"])


def test_vllm_files_are_engine_tests_and_minus_m_engine_selects_only_marked_tests(pytester):
    files = {"test_vllm_x": "def test_in_vllm_file():\n    pass\n",
             "test_b": "@pytest.mark.engine\ndef test_marked():\n    pass\n\n\ndef test_plain():\n    pass\n"}
    res = _run(pytester, files, "-m", "engine", "-rA")
    res.assert_outcomes(passed=2, deselected=1)
    res.stdout.fnmatch_lines(["PASSED test_b.py::test_marked", "PASSED test_vllm_x.py::test_in_vllm_file"])
