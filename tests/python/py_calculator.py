"""examples/calculator's Calculator, written in Python and served with troupe.serve().

    py_calculator.py SCHEMA [--rendezvous N]
        (the job from TROUPE_JOB_ID, TROUPE_TASK_INDEX, TROUPE_RESOLVER)

With --rendezvous N, add() returns only once N calls of it are in progress at once (or fails
after 3 s), and the actor allows N calls at once: it answers only if they really run
concurrently.
"""

import sys
import threading

import troupe


class Calculator:
    def __init__(self, rendezvous=0):
        self.served = 0
        self.rendezvous = threading.Barrier(rendezvous) if rendezvous else None

    def add(self, a, b):
        if self.rendezvous is not None:
            self.rendezvous.wait(timeout=3)  # raises BrokenBarrierError when alone
        self.served += 1
        return {"value": a + b}

    def divide(self, a, b):
        self.served += 1
        return {"value": a / b}  # raises ZeroDivisionError for b == 0

    def sum(self, values):
        self.served += 1
        return {"value": float(sum(values))}

    def calls(self):
        return {"count": self.served}


if __name__ == "__main__":
    at_once = int(sys.argv[3]) if sys.argv[2:3] == ["--rendezvous"] else 0
    troupe.serve(sys.argv[1], "Calculator", Calculator(at_once), name="calc",
                 max_concurrency=max(at_once, 1))
    print("STOPPED", flush=True)
