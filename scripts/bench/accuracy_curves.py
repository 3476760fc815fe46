"""Time to accuracy from curves of evaluations.

A curve is a list of ``{"steps", "seconds", "accuracy"}``, one per
evaluation, in training order (``seconds``: training time so far).

>>> curves = {"synchronous": [{"steps": 16, "seconds": 10.0, "accuracy": 0.5},
...                           {"steps": 32, "seconds": 20.0, "accuracy": 0.9}],
...           "local": [{"steps": 16, "seconds": 4.0, "accuracy": 0.6},
...                     {"steps": 32, "seconds": 8.0, "accuracy": 0.9}]}
>>> time_to(curves["local"], 0.85)["seconds"]
8.0
>>> print(table(curves, 0.85, passes=1).splitlines()[-1])
| local | 8 | 32 | 2.50x | 8 | 32 | 2.50x | 0.250 | 90.00% |
"""


def time_to(curve, target):
    """The first evaluation at or above ``target`` ({steps, seconds,
    accuracy}), or None."""
    return next((point for point in curve if point["accuracy"] >= target), None)


def table(curves, target, passes, baseline="synchronous", within=0.005) -> str:
    """Markdown, a row per curve: training seconds and steps to ``target``
    and the speed-up against ``baseline``'s time to it; the same for the
    baseline's last accuracy less ``within`` ("its accuracy, within half a
    point"); seconds per step, and the last accuracy (after ``passes``
    epochs)."""
    near = curves[baseline][-1]["accuracy"] - within
    rows = [f"| training | seconds to {100 * target:.0f}% | steps | speed-up | seconds to "
            f"{100 * near:.2f}% | steps | speed-up | s per step | accuracy after {passes} "
            "epochs |", "|---|---|---|---|---|---|---|---|---|"]
    for name, curve in curves.items():
        cells = [name]
        for accuracy in (target, near):
            reached, base = time_to(curve, accuracy), time_to(curves[baseline], accuracy)
            if reached:
                cells += [f"{reached['seconds']:.0f}", str(reached["steps"]),
                          f"{base['seconds'] / reached['seconds']:.2f}x" if base else "-"]
            else:
                cells += ["not reached", "-", "-"]
        last = curve[-1]
        cells += [f"{last['seconds'] / last['steps']:.3f}", f"{100 * last['accuracy']:.2f}%"]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"
