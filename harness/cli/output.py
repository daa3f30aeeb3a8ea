"""The terminal the command line writes to."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console

if TYPE_CHECKING:
    from harness.run.core.outcome import RunResult

# emoji off: ActiveMQ message ids contain ":-1:"; soft wrap: paths and ids must stay copyable.
console = Console(highlight=False, emoji=False, soft_wrap=True)


def expectation(result: RunResult) -> str | None:
    """Return whether a run (or soak) found what its scenario expects, in markup: ``as expected: the
    scenario expects duplicate-effect`` or ``UNEXPECTED: ...`` (None for a clean run expected clean)."""
    expect, verdict = result.spec.expect, result.verdict
    if not expect and verdict.clean:
        return None
    said = "as expected" if result.as_expected else "[red]UNEXPECTED[/]"
    return f"{said}: the scenario expects {', '.join(sorted(expect)) or 'a clean run'}"
