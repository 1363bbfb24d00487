"""One pre-flight finding: the key, the bad value, what is wrong and the fix."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    key: str
    value: object
    message: str
    fix: str

    def __str__(self) -> str:
        return f"- {self.key} = {self.value!r}: {self.message}\n  fix: {self.fix}"


def format_problems(problems: list[Problem], *, ranks_started: bool = False) -> str:
    done = (
        "the ranks stopped before touching a device: no step, no checkpoint"
        if ranks_started
        else "nothing was started"
    )
    head = f"qwen3-trainium: {len(problems)} config problem(s), {done}:"
    return "\n".join([head, *map(str, problems)])
