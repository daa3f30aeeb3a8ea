"""Attach a run's evidence to the current Allure test: verdict, manifest, plots and service logs.

The only module that imports ``allure`` (allure-pytest). Every function is a no-op outside a pytest
run with ``--alluredir``: allure's hooks then have no listener, and a call made while no test is
running (no test result to attach to) is dropped rather than raised, because a report must never
turn a verdict into a harness failure.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import allure

from harness.errors import ConfigError
from harness.reporting.allure_results import ANOMALY_LABEL, VERDICT_LABEL
from harness.verify.fired import fired_count
from harness.verify.verdict import Verdict

__all__ = ["LOG_TAIL_BYTES", "attach_file", "attach_run", "attach_verdict", "replay_command"]

# Service logs can reach hundreds of MB, and a single-file report embeds every attachment.
LOG_TAIL_BYTES = 512 * 1024

_TYPES: dict[str, Any] = {
    "png": allure.attachment_type.PNG,
    "json": allure.attachment_type.JSON,
    "text": allure.attachment_type.TEXT,
    "log": allure.attachment_type.TEXT,
}

log = logging.getLogger("txchaos.reporting")


def _guarded(what: str, call: Callable[..., object], *args: Any) -> None:
    try:
        call(*args)
    except (KeyError, AttributeError) as exc:
        # With --alluredir but no test or fixture running (e.g. from pytest_sessionfinish),
        # allure-pytest looks up a current item that does not exist (a KeyError; None for a
        # parameter, an AttributeError). Drop the attachment.
        log.debug("allure: %s dropped outside a test (%r)", what, exc)


def _summary(verdict: Verdict) -> str:
    lines = [verdict.headline(), f"scenario: {verdict.scenario or '-'}", f"engine: {verdict.engine}"]
    if verdict.seed is not None:
        lines.append(f"seed: {verdict.seed}")
    broken = verdict.broken_promises()
    if broken:  # the invariant in words: its value, the expected one, the operations behind it
        lines.append("broken promises:")
        lines.extend(f"  {b}" for b in broken)
    lines.extend(f"{k}: {v}" for k, v in sorted(verdict.stats.items()) if not isinstance(v, dict | list))
    if verdict.steps:
        lines.append("steps:")
        lines.extend(f"  {i + 1}. {s}" for i, s in enumerate(verdict.steps))
    return "\n".join(lines) + "\n"


def replay_command(verdict: Verdict) -> str:
    """Return the command that replays the verdict's run (``txchaos run NAME:VARIANT --seed N``)."""
    seed = f" --seed {verdict.seed}" if verdict.seed is not None else ""
    return f"txchaos run {verdict.scenario}{seed}"


def attach_verdict(verdict_path: Path) -> None:
    """Attach ``verdict.json`` and a text summary, and label the test the way Allure's tabs read it.

    ``feature`` is the pattern or service (the scenario's name), ``story`` the variant, a ``tag``
    per requested fault, the seed a parameter, one ``anomaly`` label per class the verdict found
    (so a passing test of a bad variant still shows what it caught, in Categories too: see
    ``allure_results.annotate``) and the replay command in the description. A run with anomalies
    is marked ``critical``.
    """
    if not verdict_path.is_file():
        return
    verdict = Verdict.load(verdict_path)
    attach_file(verdict_path, "verdict.json", "json")
    _guarded("summary", allure.attach, _summary(verdict), "verdict summary", allure.attachment_type.TEXT)
    name, _, variant = verdict.scenario.partition(":")
    if name:
        _guarded("feature", allure.dynamic.feature, name)
    _guarded("story", allure.dynamic.story, variant or ("clean" if verdict.clean else verdict.outcome))
    for fault in dict.fromkeys(f"{e.get('type')}:{e.get('name')}" for e in verdict.faults):
        _guarded("tag", allure.dynamic.tag, fault)
    if verdict.seed is not None:
        _guarded("seed", allure.dynamic.parameter, "seed", verdict.seed)
    for cls in sorted(verdict.found()):
        _guarded("anomaly", allure.dynamic.label, ANOMALY_LABEL, cls)
    _guarded("verdict", allure.dynamic.label, VERDICT_LABEL, verdict.headline())
    fired, asked = fired_count(verdict.faults)
    text = (
        f"**{verdict.outcome}**: {verdict.headline()}\n\n"
        f"faults fired: {fired} of {asked} requested\n\n"
        f"replay: `{replay_command(verdict)}`\n"
    )
    _guarded("description", allure.dynamic.description, text)
    if not verdict.anomaly_free:
        _guarded("severity", allure.dynamic.severity, allure.severity_level.CRITICAL)


def attach_file(path: Path, name: str, kind: str) -> None:
    """Attach ``path`` as ``kind`` (png, json, text or log); a log keeps only its last 512 KiB.

    A missing or empty file is skipped: the evidence that exists is still worth attaching.
    """
    if kind not in _TYPES:
        raise ConfigError(f"unknown attachment kind {kind!r} for {path}", hint=f"use one of {sorted(_TYPES)}")
    if not path.is_file():
        return
    size = path.stat().st_size
    if size == 0:
        return  # an empty attachment says nothing and opens as a blank page
    if kind in ("text", "log") and size > LOG_TAIL_BYTES:
        with path.open("rb") as fh:
            fh.seek(size - LOG_TAIL_BYTES)
            tail = fh.read().decode("utf-8", errors="replace")
        body = f"[first {size - LOG_TAIL_BYTES:,} bytes of {path} left out]\n{tail}"
        _guarded(name, allure.attach, body, name, _TYPES[kind])
        return
    _guarded(name, allure.attach.file, str(path), name, _TYPES[kind])


def attach_run(run_dir: Path) -> None:
    """Attach what a run folder holds: verdicts, manifest, PNG plots, and ``logs/*.log``."""
    attach_verdict(run_dir / "verdict.json")
    attach_file(run_dir / "verdict-spark.json", "verdict-spark.json (Spark engine)", "json")
    attach_file(run_dir / "manifest.json", "manifest.json", "json")
    for png in sorted(run_dir.glob("*.png")):  # timeline.png, latency.png
        attach_file(png, png.name, "png")
    for service_log in sorted((run_dir / "logs").glob("*.log")):
        attach_file(service_log, f"logs/{service_log.name}", "log")
