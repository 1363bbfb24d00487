"""The quick pre-flight (``check_static``) and the full one (``check``) are built from one registry
(``preflight/registry.py``). Watched from outside, by the calls they make: every check the quick
tier runs, the full tier runs too, in the same order. Were the lists copied by hand, a check added
to one and forgotten in the other would fail here."""

from __future__ import annotations

import sys

from conftest import resolve

from qwen3_trainium.parent import preflight

LISTS = tuple(f"qwen3_trainium.parent.preflight{m}" for m in ("", ".registry", ".shape"))
# The quick tier's lighter form of a full check (model.py: the same checks without the model's dims)
LIGHTER = {"check_model_static": "check_model"}


def _checks_called(function, *args, **kwargs) -> list[str]:
    """The ``check_*`` functions ``function`` calls from the lists (not those the checks call
    themselves), in the order of their first call."""
    called: list[str] = []

    def trace(frame, event, arg):  # at each call only: returning None traces no lines
        if frame.f_code.co_name.startswith("check_") and frame.f_back is not None:
            caller = frame.f_back.f_globals.get("__name__")
            if caller in LISTS and frame.f_code.co_name not in called:
                called.append(frame.f_code.co_name)
            if frame.f_code.co_name == "check_titan":
                sys.settrace(None)  # the last check of the lists: the model build need not be traced

    sys.settrace(trace)
    try:
        function(*args, **kwargs)
    finally:
        sys.settrace(None)
    return called


def test_every_quick_check_is_in_the_full_pass_in_the_same_order(tmp_path):
    run = resolve("model=native", "smoke=on", "tracking=off")
    preflight.check(
        run, str(tmp_path), launching=True
    )  # untraced first: the imports, which tracing slows most
    quick = _checks_called(preflight.check_static, run, str(tmp_path), launching=True)
    full = _checks_called(preflight.check, run, str(tmp_path), launching=True)
    assert len(quick) >= 15, quick  # the lists were seen
    as_full = [LIGHTER.get(name, name) for name in quick]
    assert [name for name in full if name in as_full] == as_full, (quick, full)
    assert "check_titan" in full and "check_titan" not in quick  # the full tier ran to its end
