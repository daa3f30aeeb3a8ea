"""The terminal the command line writes to."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.text import Text

if TYPE_CHECKING:
    from harness.run.core.outcome import RunResult
    from harness.verify.verdict import Verdict

# emoji off: ActiveMQ message ids contain ":-1:"; soft wrap: paths and ids must stay copyable.
# markup off: what is printed is data (a verdict names its first op ids in brackets,
# ``duplicate-effect=1 [op-7]``, which rich's markup took for a style tag and dropped); a line is
# coloured with ``style=`` or a ``Text`` of styled parts instead.
console = Console(highlight=False, emoji=False, soft_wrap=True, markup=False)


def verdict_line(label: str, verdict: Verdict) -> Text:
    """Return ``label: HEADLINE``, the label bold and the headline coloured by the outcome."""
    return Text.assemble((label, "bold"), ": ", (verdict.headline(), "green" if verdict.clean else "red"))


def expectation(result: RunResult) -> Text | None:
    """Return whether a run (or soak) found what its scenario expects, indented: ``as expected: the
    scenario expects duplicate-effect`` or ``UNEXPECTED: ...`` in red (None for a clean run expected clean)."""
    expect, verdict = result.spec.expect, result.verdict
    if not expect and verdict.clean:
        return None
    said = ("as expected", "") if result.as_expected else ("UNEXPECTED", "red")
    return Text.assemble("  ", said, f": the scenario expects {', '.join(sorted(expect)) or 'a clean run'}")
