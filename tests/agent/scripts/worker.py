"""Test worker for the agent tests: one script, behaviour chosen by --mode.

Modes that need torch.distributed import torch; the others stay fast (no torch).
Every worker writes its pid to $PIDS_DIR (when set) so tests can check /proc.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import traceback

RANK = int(os.environ.get("RANK", "0"))
RESTART = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def note_pid(tag: str, pid: int) -> None:
    d = os.environ.get("PIDS_DIR")
    if d:
        with open(os.path.join(d, f"{tag}.{pid}"), "w") as f:
            f.write(str(pid))


def gloo_group():
    import torch.distributed as dist

    dist.init_process_group("gloo")
    dist.barrier()
    return dist


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", required=True)
    p.add_argument("--rank", type=int, default=1, help="the rank that misbehaves")
    p.add_argument("--code", type=int, default=3)
    p.add_argument("--lines", type=int, default=0)
    p.add_argument("--dir", default="")
    a = p.parse_args()
    note_pid(f"worker{RANK}", os.getpid())
    me = RANK == a.rank
    print(f"start rank={RANK} restart={RESTART} pid={os.getpid()}", flush=True)

    if a.mode == "env":
        dist = gloo_group()
        keys = [
            "RANK",
            "LOCAL_RANK",
            "WORLD_SIZE",
            "LOCAL_WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
            "ROLE_NAME",
            "GROUP_RANK",
            "TORCHELASTIC_TIMER_FILE",
            "TORCHSTEP_HEARTBEAT_FILE",
            "TORCHSTEP_OUTPUT_FILE",
            "TORCHELASTIC_ERROR_FILE",
            "TORCHSTEP_RESULT_FILE",
            "TORCHSTEP_LOG_DIR",
        ]
        print("ENV " + json.dumps({k: os.environ.get(k) for k in keys}), flush=True)
        print(f"stderr line of rank {RANK}", file=sys.stderr, flush=True)
        import torchstep

        torchstep.output("rank_seen", RANK)
        torchstep.output("metrics", {"acc": 0.5, "world": dist.get_world_size()})
        dist.barrier()
        dist.destroy_process_group()
    elif a.mode in ("crash-once", "crash-always"):
        dist = gloo_group()
        if me and (a.mode == "crash-always" or RESTART == 0):
            import torchstep.worker

            try:
                raise ValueError(f"boom on rank {RANK}")
            except ValueError as e:
                torchstep.worker.write_error_file(e)  # the traceback for the result
                traceback.print_exc()
                sys.exit(a.code)
        dist.barrier()
        dist.destroy_process_group()
    elif a.mode == "exit":  # no torch: exit with --code on --rank
        for i in range(a.lines):
            print(f"line {i} of rank {RANK}", flush=True)
        if me:
            sys.exit(a.code)
        time.sleep(30)  # the agent stops us
    elif a.mode == "all-fail":  # every rank fails within milliseconds, the last rank first
        world = int(os.environ.get("WORLD_SIZE", "1"))
        open(os.path.join(a.dir, f"ready.{RANK}"), "w").close()
        while len([n for n in os.listdir(a.dir) if n.startswith("ready.")]) < world:
            time.sleep(0.001)
        time.sleep((world - 1 - RANK) * 0.004)
        print(f"failing on purpose: rank {RANK}", flush=True)
        os._exit(a.code)
    elif a.mode == "selfkill":
        if me:
            os.kill(os.getpid(), a.code)
        time.sleep(30)
    elif a.mode == "raise":  # torchstep.record on every rank; rank --rank raises
        import torchstep

        @torchstep.record
        def run() -> None:
            for i in range(a.lines):
                print(f"line {i} of rank {RANK}", flush=True)
            if me:
                raise RuntimeError(f"bad thing on rank {RANK}")
            time.sleep(30)

        run()
    elif a.mode == "nonretryable-slow-exit":
        # rank --rank raises NonRetryableError and is slow to exit (a long teardown); the
        # others fail as a broken collective makes them once it has raised: first, by exit code
        import atexit

        import torchstep

        marker = os.path.join(a.dir, "raised")
        if me:

            def slow_exit() -> None:
                open(marker, "w").close()
                time.sleep(60)

            atexit.register(slow_exit)

            @torchstep.record
            def run() -> None:
                raise torchstep.NonRetryableError("dataset missing")

            run()
        else:
            while not os.path.exists(marker):
                time.sleep(0.05)
            print(f"rank {RANK}: Connection closed by peer", flush=True)
            sys.exit(1)
    elif a.mode.startswith("nonretryable"):
        variant = a.mode.split("-", 1)[1]
        if variant == "torchstep":
            import torchstep

            @torchstep.record
            def run() -> None:
                if me:
                    raise torchstep.NonRetryableError("dataset missing")
                time.sleep(30)

            run()
        elif variant == "torch":
            import torchstep
            from torch.distributed.elastic.multiprocessing.errors import record

            @record
            def run() -> None:
                if me:
                    raise torchstep.NonRetryableError("dataset missing")
                time.sleep(30)

            run()
        else:  # the reserved exit code
            if me:
                sys.exit(82)
            time.sleep(30)
    elif a.mode in ("timer-torch", "timer-torchstep"):
        dist = gloo_group()
        if me and RESTART == 0:
            if a.mode == "timer-torch":
                from torch.distributed.elastic import timer

                timer.configure(timer.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
                with timer.expires(after=2, scope="stuck-step"):
                    time.sleep(60)
            else:
                import torchstep

                with torchstep.expires(after=2, scope="stuck-step"):
                    time.sleep(60)
        else:
            import torchstep

            with torchstep.expires(after=60):  # a timer that does not expire does nothing
                pass
        dist.barrier()
        dist.destroy_process_group()
    elif a.mode == "heartbeat":
        import torchstep

        deadline = time.time() + 6
        while time.time() < deadline:
            if not me:
                torchstep.heartbeat()
            time.sleep(0.1)
    elif a.mode == "linger":  # ignores SIGTERM, has a grandchild that ignores it too
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        note_pid(f"grandchild{RANK}", child.pid)
        open(os.path.join(a.dir, f"ready.{RANK}"), "w").close()
        time.sleep(300)
    elif a.mode == "grandchild":  # plain worker with a plain grandchild (SIGTERM works)
        child = subprocess.Popen(["sleep", "300"])
        note_pid(f"grandchild{RANK}", child.pid)
        open(os.path.join(a.dir, f"ready.{RANK}"), "w").close()
        time.sleep(300)
    else:
        sys.exit(f"unknown mode {a.mode}")


if __name__ == "__main__":
    main()
    # skip the interpreter's teardown (~0.5-1 s with torch loaded): keeps the suite fast
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
