"""Append one line per attempt to the marker file; fail the first N attempts."""

import sys

import torchstep


@torchstep.record
def main() -> None:
    marker, fail_times, non_retryable = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "True"
    with open(marker, "a") as f:
        f.write("attempt\n")
    with open(marker) as f:
        attempts = len(f.readlines())
    if non_retryable:
        raise torchstep.NonRetryableError(f"attempt {attempts}: bad input, retrying cannot help")
    if attempts <= fail_times:
        print(f"attempt {attempts}: failing on purpose", flush=True)
        sys.exit(3)
    print(f"attempt {attempts}: ok", flush=True)
    torchstep.output("attempts", attempts)


main()
