"""examples/calculator's Calculator, written in Python and served with troupe.serve().

    py_calculator.py SCHEMA    (the job from TROUPE_JOB_ID, TROUPE_TASK_INDEX, TROUPE_RESOLVER)
"""

import sys

import troupe


class Calculator:
    def __init__(self):
        self.served = 0

    def add(self, a, b):
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
    troupe.serve(sys.argv[1], "Calculator", Calculator(), name="calc")
    print("STOPPED", flush=True)
