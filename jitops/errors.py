"""Exceptions jitops raises. Every message says what was wrong and what was expected."""
from __future__ import annotations

from pathlib import Path


class JitopsError(Exception):
    """Base class of every jitops error."""


class ArgumentError(JitopsError, ValueError):
    """A bad argument to an op or API: names the argument and what was expected."""

    def __init__(self, argument: str, expected: str, got: object | None = None, op: str | None = None):
        self.argument = argument
        self.expected = expected
        self.got = got
        where = f"{op}: " if op else ""
        msg = f"{where}argument '{argument}': expected {expected}"
        if got is not None:
            msg += f", got {got}"
        super().__init__(msg)


class BackendUnavailable(JitopsError):
    """The requested backend cannot be created here (missing library, no device, bad name)."""


class DeviceRequired(JitopsError):
    """An offline (compile-only) backend was asked to run something."""


class CompileError(JitopsError):
    """The runtime compiler rejected a rendered kernel. Carries the log and the saved source."""

    def __init__(self, backend: str, target: str, log: str, source_path: Path | None):
        self.log = log
        self.source_path = source_path
        where = f"\nrendered source saved to: {source_path}" if source_path else ""
        super().__init__(f"{backend} compile for {target} failed:\n{log.strip()}{where}")


class RenderError(JitopsError):
    """Jinja produced Python that does not compile for a template (not a template syntax error, which
    Jinja reports itself). Carries the paths of the template and of Jinja's generated module."""

    def __init__(self, template: str, detail: str, generated_path: Path | None):
        self.template = template
        self.generated_path = generated_path
        where = f"\nJinja's generated module saved to: {generated_path}" if generated_path else ""
        super().__init__(f"rendering template {template} failed twice: {detail}{where}")


class LaunchError(JitopsError):
    """A driver call failed while loading or launching a kernel."""


class EmulatorFault(LaunchError):
    """The CPU emulator caught a bad memory access or a barrier deadlock."""


class ScheduleError(JitopsError):
    """A schedule that cannot run on this problem or device (e.g. forced matrix cores on the CPU)."""
