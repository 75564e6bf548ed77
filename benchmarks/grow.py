"""A job for the swarm benchmarks: grow to SIZE bytes over GROW seconds, hold HOLD seconds.

Usage: python grow.py SIZE_BYTES [GROW_SECONDS] [HOLD_SECONDS] [DONE_FILE] [START_DELAY] [STEPS]
Memory is written, not only reserved, so every page is really charged.
START_DELAY seconds pass idle first, as a job importing its libraries does.
STEPS (20 unless given) is how many equal allocations the growth takes: 20 is a
steady climb, 3 a stepwise one.  A DONE_FILE of "-" writes none.
"""

import sys
import time

size = int(sys.argv[1])
grow = float(sys.argv[2]) if len(sys.argv) > 2 else 3.0
hold = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0
if len(sys.argv) > 5:
    time.sleep(float(sys.argv[5]))
steps = int(sys.argv[6]) if len(sys.argv) > 6 else 20
chunk = size // steps
held = []
for _ in range(steps):
    held.append(b"\x01" * chunk)  # allocated and written: every page is touched
    time.sleep(grow / steps)
time.sleep(hold)
if len(sys.argv) > 4 and sys.argv[4] != "-":
    with open(sys.argv[4], "w") as f:
        f.write("done\n")
