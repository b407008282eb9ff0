"""The live view of a batch run (`apsat zoo`): which model each worker is on and in which
phase, done / failed / reused counts and an estimate of the time left."""
from __future__ import annotations

import time


class BatchProgress:
    """Follows a batch run's events (`on_event`, see apsat.pipeline.batch.run_local) and
    renders them for rich's Live (`__rich__`)."""

    def __init__(self, total: int, jobs: int):
        self.total, self.jobs = total, max(1, jobs)
        self.running: dict[str, list] = {}        # model -> [phase, started]
        self.counts = {"done": 0, "failed": 0, "reused": 0}
        self.finished_seconds: list[float] = []
        self.started = time.monotonic()

    def on_event(self, kind: str, what, detail):
        """A run_local/run_dask event: "start" (name, pid), "phase" (name, phase), "done"
        (row) or "reused" (row)."""
        if kind == "start":
            self.running[what] = ["starting", time.monotonic()]
        elif kind == "phase" and what in self.running:
            self.running[what][0] = detail
        elif kind in ("done", "reused"):
            self.running.pop(what.get("model"), None)
            status = what.get("status")
            key = "reused" if kind == "reused" else ("done" if status in ("ok", "mismatch") else "failed")
            self.counts[key] += 1
            if kind == "done" and what.get("seconds"):
                self.finished_seconds.append(float(what["seconds"]))

    def eta_seconds(self) -> float | None:
        """Seconds left: the mean time of a finished model times the models still to run,
        shared among the workers; None before any model finished."""
        if not self.finished_seconds:
            return None
        left = self.total - sum(self.counts.values())
        return sum(self.finished_seconds) / len(self.finished_seconds) * left / self.jobs

    def __rich__(self):
        from rich.table import Table

        table = Table(title=None, show_edge=False, pad_edge=False)
        for col in ("model", "phase", "s"):
            table.add_column(col, justify="right" if col == "s" else "left")
        now = time.monotonic()
        for name, (phase, started) in sorted(self.running.items()):
            table.add_row(name, phase, f"{now - started:.0f}")
        eta = self.eta_seconds()
        c = self.counts
        table.caption = (f"{c['done']} done, {c['failed']} failed, {c['reused']} reused of {self.total}"
                         f" · {now - self.started:.0f} s" + ("" if eta is None else f" · ~{eta:.0f} s left"))
        return table
