"""The three error families a CI gate tells apart by exit code.

- ``ConfigError`` (exit 2): the user's input or machine setup is wrong; raised before any service starts.
- ``HarnessError`` (exit 3): the stack or the harness itself failed; the verdict is unknown.
- ``InvariantViolation`` (exit 1): the system under test lost or duplicated something.
- ``ServiceFailed`` (exit 5): a team's service under test ended by itself (no trap, rule or fault
  explains it): the service failed, which is not an anomaly of the flow.
- ``IncompleteEvidence`` (exit 4): the run folder does not hold the evidence for a full verdict
  (the run was killed before it closed its books, or its ledger is damaged beyond repair).
- ``UnfiredFault`` (exit 6): a requested crash, trap or fault window never fired, so the run did
  not test what it asked (a trap on a commit the service never sends, an op the flow never
  reaches); no anomaly, but not clean either.

Every message names the bad value and says how to fix it, as a ``Hint:`` line.
"""

from __future__ import annotations


class TxChaosError(Exception):
    """Root of every error the harness raises on purpose."""

    exit_code = 3

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.message = message  # without the hint: for a caller that words its own
        self.hint = hint
        super().__init__(f"{message}\nHint: {hint}" if hint else message)


def error_lines(exc: TxChaosError) -> str:
    """Return the lines a command prints for ``exc`` on stderr: ``txchaos: ConfigError: ...`` and its
    ``Hint:``, the same from every subcommand (plain text, never wrapped: it names a value to copy)."""
    return f"txchaos: {type(exc).__name__}: {exc}\n"


class ConfigError(TxChaosError):
    """Bad user input: a spec value, an option, a missing tool. Nothing has started yet."""

    exit_code = 2


class HarnessError(TxChaosError):
    """The stack or the harness failed: the run proves nothing about the system under test."""

    exit_code = 3


class StackError(HarnessError):
    """A service did not start, answer or stop; carries the service's last log lines."""

    def __init__(self, message: str, *, hint: str | None = None, log_tail: str = "") -> None:
        self.log_tail = log_tail
        tail = f"\n--- last log lines ---\n{log_tail}" if log_tail else ""
        super().__init__(message + tail, hint=hint)


EXIT_INCOMPLETE = 4  # also the exit code of a verdict whose outcome is "incomplete"


class IncompleteEvidence(TxChaosError):
    """The run folder does not hold the evidence for a full verdict; nothing is known to be wrong."""

    exit_code = EXIT_INCOMPLETE


EXIT_UNFIRED = 6  # also the exit code of a verdict whose outcome is "unfired"


class UnfiredFault(TxChaosError):
    """A requested fault never fired: the run is no evidence either way about that fault."""

    exit_code = EXIT_UNFIRED


class InvariantViolation(TxChaosError):
    """The system under test broke a no-loss / no-duplicate invariant; carries the verdict."""

    exit_code = 1

    def __init__(self, message: str, *, seed: int | None = None, steps: tuple[str, ...] = ()) -> None:
        self.seed = seed
        self.steps = steps
        replay = ""
        if seed is not None:
            replay = f"\nseed: {seed}"
        if steps:
            replay += "\nsteps:\n" + "\n".join(f"  {i + 1}. {s}" for i, s in enumerate(steps))
        super().__init__(message + replay)


class ServiceFailed(TxChaosError):
    """The service under test ended by itself during the run: its failure, not a lost or duplicated operation."""

    exit_code = 5
