"""Safe parsing of the grader's junit report (grading.md rule 7).

The report is capped in size, refused outright if it declares a DOCTYPE or ENTITY (no
entity-expansion bombs, no external entities), and parsed into {test id: outcome} where the
id is "classname::name" and outcome is one of passed / failed / error / skipped.
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Dict, Tuple

MAX_REPORT_BYTES = 4 << 20
_FORBIDDEN = re.compile(rb"<!\s*(DOCTYPE|ENTITY)", re.IGNORECASE)


class ReportError(ValueError):
    """The report is missing, too large, unsafe or malformed."""


def parse_junit_bytes(data: bytes) -> Dict[str, str]:
    if len(data) > MAX_REPORT_BYTES:
        raise ReportError(f"report larger than {MAX_REPORT_BYTES} bytes")
    if _FORBIDDEN.search(data):
        raise ReportError("report declares a DOCTYPE/ENTITY; refused")
    try:
        root = ET.fromstring(data)
    except ET.ParseError as e:
        raise ReportError(f"malformed report: {e}") from None
    outcomes: Dict[str, str] = {}
    for case in root.iter("testcase"):
        tid = f"{case.get('classname', '')}::{case.get('name', '')}"
        kinds = {child.tag for child in case}
        if "error" in kinds:
            outcome = "error"
        elif "failure" in kinds:
            outcome = "failed"
        elif "skipped" in kinds:
            outcome = "skipped"
        else:
            outcome = "passed"
        # A duplicated id keeps its worst outcome (a forged "passed" copy cannot win).
        if tid in outcomes and outcomes[tid] != "passed":
            continue
        outcomes[tid] = outcome
    return outcomes


def read_junit(path: str) -> Dict[str, str]:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_REPORT_BYTES + 1)
    except OSError as e:
        raise ReportError(f"no report: {e.strerror}") from None
    return parse_junit_bytes(data)


def verdict(outcomes: Dict[str, str], expected, exit_code: int) -> Tuple[int, int, str]:
    """(passed expected, total expected, reason). All-pass needs exit 0 and every id passed."""
    expected = list(expected)
    if not expected:
        return 0, 0, "task lists no expected tests"
    passed = sum(1 for t in expected if outcomes.get(t) == "passed")
    missing = [t for t in expected if t not in outcomes]
    if passed == len(expected) and exit_code == 0:
        return passed, len(expected), "all expected tests passed"
    if missing:
        return passed, len(expected), f"{len(missing)} expected test(s) missing, e.g. {missing[0]}"
    if exit_code != 0 and passed == len(expected):
        return passed, len(expected), f"test process exit code {exit_code}"
    bad = next(t for t in expected if outcomes.get(t) != "passed")
    return passed, len(expected), f"{len(expected) - passed} expected test(s) not passed, e.g. {bad} ({outcomes[bad]})"
