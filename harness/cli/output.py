"""The terminal the command line writes to."""

from __future__ import annotations

from rich.console import Console

# emoji off: ActiveMQ message ids contain ":-1:"; soft wrap: paths and ids must stay copyable.
console = Console(highlight=False, emoji=False, soft_wrap=True)
