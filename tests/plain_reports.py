"""A pytest plugin: a failure that pytest cannot render is still reported, as plain text.

pytest renders a failure from its traceback's line numbers; a frame without one (Python 3.11
gives None for an instruction that has no line, as when a signal handler raises there) makes the
rendering raise. Under xdist that ends the whole run with an INTERNALERROR naming the test and
nothing else. Here the failure is reported with Python's own rendering of the traceback, which
takes frames without a line, and the run goes on.
"""

from __future__ import annotations

import traceback
from collections.abc import Generator

import pytest
from _pytest.reports import TestReport


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, TestReport, TestReport]:
    try:
        return (yield)
    except Exception as rendering:
        if call.excinfo is None:
            raise
        text = "".join(traceback.format_exception(call.excinfo.value))
        return TestReport(
            item.nodeid,
            item.location,
            dict.fromkeys(item.keywords, 1),
            "failed",
            f"{text}\n(pytest could not render this failure: {rendering!r})",
            call.when,
            duration=call.duration,
            start=call.start,
            stop=call.stop,
            user_properties=item.user_properties,
        )
