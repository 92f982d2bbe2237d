"""``torchstep-agent`` / ``python -m torchstep.agent``: a torchrun-compatible step entrypoint.

    torchstep-agent [torchrun flags] [torchstep flags] script [script args]

Replace ``torchrun`` by ``torchstep-agent`` in any torchrun command line: the run is the
same, plus a step result file, per-rank logs that are kept, exit codes that say what
happened, restarts that work, timers/heartbeats, signal forwarding and no orphans.
See ``docs/agent.md``. torch is imported inside :func:`main` only.

Example::

    torchstep-agent --nproc-per-node 2 --max-restarts 1 --result-file out/result.json train.py --lr 0.1
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, NoReturn

from torchstep.agent import compat, signals
from torchstep.agent.rdzv_guard import take_key, unauthenticated_note
from torchstep.contract import AGENT_ERROR_EXIT_CODE, ENV_TERMINATION_LOG
from torchstep.files import LossyFile

if TYPE_CHECKING:
    from torchstep.agent.settings import AgentSettings
    from torchstep.agent.zygote_handle import ZygoteProcess

log = logging.getLogger("torchstep.agent")
_FORMAT = "[torchstep-agent %(asctime)s %(levelname)s] %(message)s"


def console_level(environ: Mapping[str, str] | None = None) -> int:
    """The level of the agent's console (stderr): torchrun's own variable ``LOGLEVEL``
    (default ``WARNING``, as torch's elastic logger), so a run by hand is as quiet as
    torchrun's; ``<log-dir>/agent.log`` gets every ``INFO`` line whatever the level.

    Example: ``console_level({"LOGLEVEL": "INFO"})`` is ``logging.INFO``; ``console_level({})``
    is ``logging.WARNING``.
    """
    name = (os.environ if environ is None else environ).get("LOGLEVEL", "").strip().upper()
    level = logging.getLevelName(name) if name else logging.WARNING
    return level if isinstance(level, int) else logging.WARNING


def _console() -> logging.Handler | None:
    return next((h for h in log.handlers if getattr(h, "torchstep_console", False)), None)


def _setup_logging() -> None:
    if _console() is not None:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(_FORMAT))
    handler.setLevel(console_level())
    handler.torchstep_console = True  # type: ignore[attr-defined]
    log.addHandler(handler)
    log.setLevel(min(logging.INFO, handler.level))
    log.propagate = False


def _to(handler: logging.Handler | None, level: int, text: str) -> None:
    """One record to ``handler`` alone, whatever its level."""
    if handler is not None:
        handler.handle(log.makeRecord(log.name, level, __file__, 0, "%s", (text,), None))


class _LossyHandler(logging.Handler):
    """``agent.log``: every record, until a write fails (a full disk): then the file is
    left as it is and the result's warnings say ``log truncated: <path>: <reason>``."""

    def __init__(self, sink: LossyFile, warnings: list[str]) -> None:
        super().__init__(logging.INFO)
        self.sink = sink
        self.warnings = warnings

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record) + "\n"
        except Exception:
            self.handleError(record)
            return
        if not self.sink.write(text.encode("utf-8", "replace")) and self.sink.lost:
            if self.sink.lost not in self.warnings:  # said once, on the console; the file stays as it is
                self.warnings.append(self.sink.lost)
                log.warning("%s", self.sink.lost)

    def close(self) -> None:
        self.sink.close()
        super().close()


def _log_to_file(log_dir: str, warnings: list[str]) -> logging.Handler | None:
    try:
        sink = LossyFile(os.path.join(log_dir, "agent.log"))
    except OSError as e:  # a symlink planted there (UnsafePathError)
        log.warning("cannot write %s/agent.log: %s", log_dir, e)
        warnings.append(f"log not written: {os.path.join(log_dir, 'agent.log')}: {e}")
        return None
    if sink.lost:
        log.warning("%s", sink.lost)
        warnings.append(sink.lost)
        return None
    handler = _LossyHandler(sink, warnings)
    handler.setFormatter(logging.Formatter(_FORMAT))
    log.addHandler(handler)
    return handler


def settings_line(settings: AgentSettings, notes: Sequence[str] = ()) -> str:
    """The agent's one console line at the default level (every setting and its source:
    ``LOGLEVEL=INFO`` or ``agent.log``). ``notes``: short fragments that belong on it — e.g.
    how workers start when they cannot come from the zygote.

    Example: ``settings_line(settings)`` starts ``torchstep-agent effective settings: nnodes 1:1, ...``.
    """
    more = "".join(f"; {note}" for note in notes if note)
    return f"{settings.summary()}{more} (every setting and its source: LOGLEVEL=INFO or {settings.log_dir}/agent.log)"


def _print_line(text: str) -> None:
    try:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _usage_result(message: str, code: int, *, started_at: float, paths: Sequence[str] = ()) -> None:
    """A bad command line still leaves a result where the launcher looks for it (and in
    ``paths``: the ``--result-file`` of a command line the agent could not parse)."""
    from torchstep.result import FAILED, StepResult, write_json_atomic

    targets = [p for p in (*paths, os.environ.get("TORCHSTEP_RESULT_FILE")) if p]
    if not targets:
        return
    now = time.time()
    result = StepResult(
        app_id=os.environ.get("TORCHSTEP_APP_ID", "unknown"),
        state=FAILED,
        exit_code=code,
        retryable=False,
        started_at=started_at,
        ended_at=now,
        duration_s=now - started_at,
        message=message,
    )
    for path in dict.fromkeys(os.path.abspath(p) for p in targets):
        try:
            write_json_atomic(path, result.to_dict())
        except OSError:
            pass


def _result_file_flag(args: Sequence[str]) -> list[str]:
    """``--result-file PATH`` read without torchrun's parser (the torch it needs may be the
    problem): the first one on the command line, before a ``--``."""
    for i, arg in enumerate(args):
        if arg == "--":
            break
        for flag in ("--result-file", "--result_file"):
            if arg == flag and i + 1 < len(args):
                return [args[i + 1]]
            if arg.startswith(flag + "="):
                return [arg.split("=", 1)[1]]
    return []


def _torch_refusal(args: Sequence[str], started_at: float) -> int | None:
    """Exit 2 with one line (and a FAILED result) when the installed torch is outside the
    supported range, before anything imports torch (None: it is inside)."""
    why = compat.torch_refusal(compat.installed_torch())
    if not why:
        return None
    log.error("%s", why)
    _usage_result(why, 2, started_at=started_at, paths=_result_file_flag(args))
    return 2


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """The console script: :func:`run`, then exit at once with its code.

    Example: ``torchstep-agent --nproc-per-node 2 train.py`` (``torchstep.agent.cli:main``).

    The exit skips the interpreter's teardown (with torch loaded it takes 0.3-1 s of the
    step's wall time); everything is flushed and written first. Use :func:`run` to embed.
    """
    if list(sys.argv[1:] if argv is None else argv) == ["--version"]:  # before torch loads
        from importlib.metadata import version

        print(f"torchstep-agent {version('torchstep')}")
        sys.exit(0)
    code = run(argv)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def run(argv: Sequence[str] | None = None) -> int:
    """Run the agent; returns its exit code (see ``docs/agent.md``).

    Example::

        code = run(["--nproc-per-node", "2", "--result-file", "out/result.json", "train.py"])
    """
    started_at = time.time()
    _setup_logging()
    _quiet_torch_without_numpy()
    from torchstep.agent.settings import DEFAULT_SIGNALS

    # before the (slow) torch import: a signal now must still produce a result
    signals.install_early(os.environ.get("PET_SIGNALS_TO_HANDLE") or DEFAULT_SIGNALS)
    args = list(sys.argv[1:] if argv is None else argv)
    take_key()  # out of the environment before the zygote or any worker can inherit it
    from torchstep.agent.zygote import startup_environment

    return _run_cli(args, started_at, startup_environment())  # before torch loads


def _quiet_torch_without_numpy() -> None:
    """Without numpy installed (it is optional for torch), ``import torch`` warns ``Failed to
    initialize NumPy`` — in the agent, the zygote and each exec'd worker's logs. The agent
    never uses numpy: its own import of torch (and the zygote's, forked from it) says
    nothing; a worker that needs numpy still fails on its own ``import numpy``."""
    import warnings

    try:
        import numpy  # noqa: F401 - torch imports it anyway when it can
    except Exception:  # missing, or broken: torch says so in its warning
        warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)


def _start_zygote(settings: AgentSettings, startup_env: dict[str, str | None]) -> ZygoteProcess | None:
    """The worker zygote, forked from this process now that it has imported torch and runs
    no other thread yet (None: workers are exec'd; the settings line says why)."""
    if settings.exec_reason():
        return None
    from torchstep.agent.zygote_handle import ZygoteProcess

    try:
        return ZygoteProcess.fork(startup_env)
    except OSError as e:  # the run starts a fresh interpreter instead (and warns if that fails too)
        log.info("could not fork the worker zygote: %s", e)
        return None


def _run_cli(args: list[str], started_at: float, startup_env: dict[str, str | None]) -> int:
    """:func:`run` past the early signal handlers: parse, start the zygote, then run or report."""
    settings = None
    zygote = None
    try:
        refused = _torch_refusal(args, started_at)
        if refused is not None:
            return refused
        from torchstep.agent.runner import prepare_paths
        from torchstep.agent.settings import TorchrunError, UsageError, resolve

        try:
            settings = resolve(args)
            prepare_paths(settings)  # the log directory and the result files' parents
        except TorchrunError as e:  # torchrun's own check: its line and its exit status
            _print_line(e.line)
            _usage_result(f"usage error: {e.line}", e.exit_code, started_at=started_at)
            return e.exit_code
        except UsageError as e:
            log.error("%s", e)
            _usage_result(f"usage error: {e}", 2, started_at=started_at)
            return 2
        except SystemExit as e:  # argparse: --help (0) or a bad command line (2)
            code = e.code if isinstance(e.code, int) else 2
            if code:
                _usage_result("usage error: bad command line (see the agent's stderr)", code, started_at=started_at)
            return code
        signals.check()  # a signal torch's import swallowed (it raised inside its import)
        zygote = _start_zygote(settings, startup_env)
        signals.check()
        signals.install_torch(settings.config.signals_to_handle)
        return _run(settings, started_at, zygote)
    except (signals.Cancelled, Exception) as e:
        # a signal raised inside a C extension's import may surface as another exception
        signum = e.signum if isinstance(e, signals.Cancelled) else signals.pending()
        if signum is None:
            raise
        from torchstep.agent.outcome import write_all
        from torchstep.agent.runner import cancelled_before_start

        signals.enter_late_mode()
        log.warning("cancelled by %s before the workers started", signal.Signals(signum).name)
        result = cancelled_before_start(settings, signum, started_at=started_at)
        paths = list(settings.result_files) if settings else []
        if not paths and os.environ.get("TORCHSTEP_RESULT_FILE"):
            paths = [os.environ["TORCHSTEP_RESULT_FILE"]]
        write_all(result, paths)
        return result.exit_code if result.exit_code is not None else 128 + signum
    finally:
        if zygote is not None:  # the run stopped it already, or never got to use it
            zygote.stop()


def _run(settings: AgentSettings, started_at: float, zygote: ZygoteProcess | None = None) -> int:
    from torch.distributed.elastic.multiprocessing import SignalException

    from torchstep.agent.outcome import Outcome, build_result, result_paths, write_all
    from torchstep.agent.runner import AgentRun

    run = None
    warnings: list[str] = []  # the result's: files a full disk truncated or kept from being written
    try:
        for name in settings.consumed_env:
            os.environ.pop(name, None)  # launcher settings are for this agent, not a nested one
        os.environ.update(settings.process_env)
        try:
            sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
        except (AttributeError, ValueError):
            pass
        to_file = _log_to_file(settings.log_dir, warnings)
        console = _console()
        if console is not None and console.level <= logging.INFO:  # LOGLEVEL=INFO: everything, everywhere
            log.info("%s", settings.describe())
        else:  # like torchrun: one line on the console; every setting and its source in agent.log
            # a short fragment that belongs on this one line (how workers start when they do
            # not come from the zygote...) is passed as settings_line(settings, notes)
            why = settings.exec_reason()
            newer = compat.newer_than_checked(compat.installed_torch())
            notes = [f"workers exec'd ({why})" if why else "", newer, unauthenticated_note(settings.config)]
            _to(console, logging.INFO, settings_line(settings, notes))
            _to(to_file, logging.INFO, settings.describe())
        run = AgentRun(settings, started_at=started_at, zygote=zygote, warnings=warnings)
        outcome = run.execute()
    except (signals.Cancelled, SignalException) as e:
        signals.enter_late_mode()
        outcome = Outcome("cancelled", signal=e.signum if isinstance(e, signals.Cancelled) else int(e.sigval))
    except Exception as e:  # our own machinery failed around the run: still a result, exit 83
        signum = signals.pending()  # ... or a signal surfaced as another exception
        signals.enter_late_mode()
        if signum is not None:
            outcome = Outcome("cancelled", signal=signum)
        else:
            log.exception("agent error")
            outcome = Outcome("agent_error", message=f"agent error: {type(e).__name__}: {e}")
    if run is not None:
        result = run.finish(outcome)
        paths, unwritten = run.result_paths, run.unwritten
    else:
        result = build_result(settings, None, outcome, started_at=started_at, warnings=warnings)
        paths = result_paths(settings)
        unwritten = write_all(result, paths)
    # the agent's last line: INFO (agent.log only, unless LOGLEVEL=INFO) when all is well
    level = logging.INFO if result.state == "SUCCEEDED" else logging.ERROR
    log.log(
        level,
        "%s (exit %s, restarts %d): %s",
        result.state,
        result.exit_code,
        result.restarts,
        result.message or "all workers succeeded",
    )
    written = [p for p in paths if p not in unwritten]
    log.info("result: %s; logs: %s", ", ".join(written) or "not written", settings.log_dir)
    code = result.exit_code if result.exit_code is not None else 1
    lost = [p for p in unwritten if p in settings.result_files]
    termination_log = os.environ.get(ENV_TERMINATION_LOG)
    delivered = bool(termination_log) and termination_log not in unwritten  # the launcher reads it there
    if lost and code == 0 and not delivered:  # a caller that reads the result file must not see success without it
        log.error("the result could not be written to %s: exiting %d", ", ".join(lost), AGENT_ERROR_EXIT_CODE)
        return AGENT_ERROR_EXIT_CODE
    return code


if __name__ == "__main__":
    main()
