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
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

from torchstep.agent import signals
from torchstep.contract import AGENT_ERROR_EXIT_CODE
from torchstep.files import open_private

if TYPE_CHECKING:
    from torchstep.agent.settings import AgentSettings
    from torchstep.agent.zygote import ZygoteProcess

log = logging.getLogger("torchstep.agent")
_FORMAT = "[torchstep-agent %(asctime)s %(levelname)s] %(message)s"


def _setup_logging() -> None:
    if log.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(_FORMAT))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def _check_paths(settings: AgentSettings) -> None:
    """Before anything starts, every result file can be written (the log dir was checked
    by ``resolve``): a result that could not be written later would be lost silently."""
    from torchstep.agent.settings import UsageError
    from torchstep.files import UnsafePathError, private_dir

    for path in settings.result_files:
        parent = os.path.dirname(path) or "."
        try:
            if not os.path.isdir(parent):
                private_dir(parent)
            if os.path.isdir(path) or os.path.islink(path):
                raise UnsafePathError(path, "is a directory or a symlink", "name a file path")
            if not os.access(parent, os.W_OK | os.X_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
                raise UnsafePathError(path, "is not writable", "choose a path you can write")
        except UnsafePathError as e:
            raise UsageError(f"--result-file {e}") from None


def _log_to_file(log_dir: str) -> logging.Handler | None:
    try:
        fd = open_private(os.path.join(log_dir, "agent.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        handler = logging.StreamHandler(os.fdopen(fd, "a", encoding="utf-8"))
    except OSError as e:
        log.warning("cannot write %s/agent.log: %s", log_dir, e)
        return None
    handler.setFormatter(logging.Formatter(_FORMAT))
    log.addHandler(handler)
    return handler


def _usage_result(message: str, code: int, *, started_at: float) -> None:
    """A bad command line still leaves a result where the launcher looks for it."""
    from torchstep.result import FAILED, StepResult, write_json_atomic

    path = os.environ.get("TORCHSTEP_RESULT_FILE")
    if not path:
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
    try:
        write_json_atomic(path, result.to_dict())
    except OSError:
        pass


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """The console script: :func:`run`, then exit at once with its code.

    Example: ``torchstep-agent --nproc-per-node 2 train.py`` (``torchstep.agent.cli:main``).

    The exit skips the interpreter's teardown (with torch loaded it takes 0.3-1 s of the
    step's wall time); everything is flushed and written first. Use :func:`run` to embed.
    """
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
    from torchstep.agent.settings import DEFAULT_SIGNALS

    # before the (slow) torch import: a signal now must still produce a result
    signals.install_early(os.environ.get("PET_SIGNALS_TO_HANDLE") or DEFAULT_SIGNALS)
    args = list(sys.argv[1:] if argv is None else argv)
    zygote = _prestart_zygote(args)
    try:
        return _run_cli(args, started_at, zygote)
    finally:
        if zygote is not None:  # the run stopped it already, or never used it
            zygote.stop()


def _prestart_zygote(args: list[str]) -> ZygoteProcess | None:
    """``--zygote``: start the worker zygote now, so that its ``import torch`` runs alongside
    the agent's own (the settings, parsed later, decide whether it is used: a stray
    ``--zygote`` among the script's own arguments costs one unused process)."""
    from torchstep.agent.settings import zygote_from_env

    if "--zygote" not in args and not zygote_from_env(os.environ):
        return None
    from torchstep.agent.zygote import ZygoteProcess

    try:
        return ZygoteProcess.prestart()
    except OSError as e:
        log.warning("--zygote: could not start the worker zygote (%s); workers start as usual", e)
        return None


def _run_cli(args: list[str], started_at: float, zygote: ZygoteProcess | None) -> int:
    """:func:`run` once the zygote (if any) is starting: parse, then run or report."""
    settings = None
    try:
        from torchstep.agent.settings import UsageError, resolve

        try:
            settings = resolve(args)
            _check_paths(settings)
        except UsageError as e:
            log.error("%s", e)
            _usage_result(f"usage error: {e}", 2, started_at=started_at)
            return 2
        except SystemExit as e:  # argparse: --help (0) or a bad command line (2)
            code = e.code if isinstance(e.code, int) else 2
            if code:
                _usage_result("usage error: bad command line (see the agent's stderr)", code, started_at=started_at)
            return code
        signals.install_torch(settings.config.signals_to_handle)
        return _run(settings, started_at, zygote)
    except signals.Cancelled as e:
        from torchstep.agent.outcome import write_all
        from torchstep.agent.runner import cancelled_before_start

        signals.enter_late_mode()
        log.warning("cancelled by %s before the workers started", e)
        result = cancelled_before_start(settings, e.signum, started_at=started_at)
        paths = list(settings.result_files) if settings else []
        if not paths and os.environ.get("TORCHSTEP_RESULT_FILE"):
            paths = [os.environ["TORCHSTEP_RESULT_FILE"]]
        write_all(result, paths)
        return result.exit_code if result.exit_code is not None else 128 + e.signum


def _run(settings: AgentSettings, started_at: float, zygote: ZygoteProcess | None = None) -> int:
    from torch.distributed.elastic.multiprocessing import SignalException

    from torchstep.agent.outcome import Outcome, build_result, write_all
    from torchstep.agent.runner import AgentRun

    run = None
    try:
        for name in settings.consumed_env:
            os.environ.pop(name, None)  # launcher settings are for this agent, not a nested one
        os.environ.update(settings.process_env)
        try:
            sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
        except (AttributeError, ValueError):
            pass
        to_file = _log_to_file(settings.log_dir)
        if os.environ.get("LOGLEVEL", "").upper() in ("INFO", "DEBUG"):
            log.info("%s", settings.describe())
        else:  # like torchrun: one line on the console; the full list in agent.log
            log.info("%s (every setting and its source: LOGLEVEL=INFO or %s/agent.log)", settings.summary(),
                     settings.log_dir)  # fmt: skip
            if to_file is not None:
                to_file.handle(log.makeRecord(log.name, logging.INFO, __file__, 0, "%s", (settings.describe(),), None))
        run = AgentRun(settings, started_at=started_at, zygote=zygote)
        outcome = run.execute()
    except (signals.Cancelled, SignalException) as e:
        signals.enter_late_mode()
        outcome = Outcome("cancelled", signal=e.signum if isinstance(e, signals.Cancelled) else int(e.sigval))
    except Exception as e:  # our own machinery failed around the run: still a result, exit 83
        signals.enter_late_mode()
        log.exception("agent error")
        outcome = Outcome("agent_error", message=f"agent error: {type(e).__name__}: {e}")
    if run is not None:
        result = run.finish(outcome)
        paths = run.result_paths
    else:
        result = build_result(settings, None, outcome, started_at=started_at)
        paths = [*settings.result_files, os.path.join(settings.log_dir, "result.json")]
        write_all(result, paths)
    level = logging.INFO if result.state == "SUCCEEDED" else logging.ERROR
    log.log(
        level,
        "%s (exit %s, restarts %d): %s",
        result.state,
        result.exit_code,
        result.restarts,
        result.message or "all workers succeeded",
    )
    log.info("result: %s; logs: %s", ", ".join(paths), settings.log_dir)
    code = result.exit_code if result.exit_code is not None else 1
    lost = [p for p in (run.unwritten if run is not None else []) if p in settings.result_files]
    if lost and code == 0:  # a caller that reads the result file must not see success without it
        log.error("the result could not be written to %s: exiting %d", ", ".join(lost), AGENT_ERROR_EXIT_CODE)
        return AGENT_ERROR_EXIT_CODE
    return code


if __name__ == "__main__":
    main()
