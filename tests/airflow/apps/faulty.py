"""A worker that misbehaves on purpose: ``faulty.py MODE STATE_DIR [TIMES]``.

flaky          fail the first TIMES attempts (counted in STATE_DIR/flaky.count), then succeed
non_retryable  raise torchstep.NonRetryableError
hang           record pid/ppid in STATE_DIR/pids.<pid>, then sleep until killed
fail           always fail with a RuntimeError
"""

import os
import sys
import time

import torchstep


@torchstep.record
def main() -> None:
    mode, state = sys.argv[1], sys.argv[2]
    rank = os.environ.get("RANK", "?")
    print(f"faulty worker rank {rank} mode {mode} pid {os.getpid()}", flush=True)
    if mode == "flaky":
        counter = os.path.join(state, "flaky.count")
        done = int(open(counter).read()) if os.path.exists(counter) else 0
        if done < int(sys.argv[3]):
            with open(counter, "w") as f:
                f.write(str(done + 1))
            raise RuntimeError(f"flaky failure number {done + 1}")
        print("flaky worker succeeds now", flush=True)
        torchstep.output("failures_before_success", done)
    elif mode == "non_retryable":
        raise torchstep.NonRetryableError("the input is bad: retrying cannot help")
    elif mode == "hang":
        with open(os.path.join(state, f"pids.{os.getpid()}"), "w") as f:
            f.write(f"{os.getpid()} {os.getppid()}")
        time.sleep(3600)
    elif mode == "fail":
        raise RuntimeError("this step always fails")
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
